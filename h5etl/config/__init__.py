"""Reading a config: the only pydantic code (spec, rules, messages, field models)."""
