"""planning: discover and plan a build (every build's first steps), and the dry run.

``plan_only`` finds the samples, reads the release the link points at (it keeps the splits
sticky) and plans; header probes run only in a dry run without ``--decode``. ``dry_run``
predicts a build from that plan (decoding every sample with ``--decode``) and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from h5etl import timeline
from h5etl.config.spec import Spec
from h5etl.execute import assembly, mapping, schedule
from h5etl.execute.assembly import Stopwatch, decoded, planned, processed
from h5etl.history import release_notes
from h5etl.history.build_report import (
    DECODE_CHECKS,
    PLAN_CHECKS,
    BuildReport,
    enforce_limit,
    guard,
    require_samples,
)
from h5etl.incremental import parent
from h5etl.pipeline import settle
from h5etl.plan import admit, discover
from h5etl.plan import split_assign as assign
from h5etl.plan.result import Plan
from h5etl.release.remote_folder import output_folder
from h5etl.stats.tallies import Tallies

ProgressHook = Callable[[str, int, int | None], None]
"""``hook(stage, advance, total)``: ``advance=0`` opens the next stage (``total`` steps, or None
if unknown); stages come one after another: discover, probe, decode+write (or decode)."""


def dry_run(
    spec: Spec, hook: ProgressHook, jobs: int, decoder: schedule.Decoder | None
) -> BuildReport:
    """A dry run; with a ``decoder``, every sample is decoded as a build would. The loss
    guard compares with the linked release as the build would (without decoding, the
    classes as planned: a label is known before decoding)."""
    report, plan, watch, _ = plan_only(spec, hook, jobs, headers=decoder is None)
    report.checks = (
        [*PLAN_CHECKS, *header_checks(spec)]
        if decoder is None
        else [PLAN_CHECKS[0], *DECODE_CHECKS]
    )
    enforce_limit(spec, report.rejects, report.inputs)
    if decoder is not None:
        counts = dict.fromkeys(plan.splits, 0)
        recipe = assembly.recipe_of(plan)
        hook("decode", 0, plan.total)
        cutter = assembly.cutter(spec, plan, None)
        tallies = Tallies()
        planned_rejects = len(report.rejects)
        for result in decoded(cutter, recipe, decoder):
            counts[result.task.split] += result.accepted
            report.rejects.extend(result.rejects)
            enforce_limit(spec, report.rejects, report.inputs)
            tallies.add(result)
            hook("decode", processed(result), None)
        report.samples = counts
        report.class_counts = tallies.class_counts(assembly.layout_record(spec, plan))
        settled = settle.resettled(spec, plan, report.rejects[planned_rejects:])
        if settled is not None:  # the build splits the samples it stores again: so here
            report.samples = {split: len(members) for split, members in settled.splits.items()}
            report.warnings.append(settle.line(plan, settled))
            plan = settled  # what the build's loss guard sees planned
        watch.lap("decode")
    else:
        report.class_counts = assembly.planned_classes(plan)  # the guard's empty classes
        report.warnings.extend(unchecked(spec))
    require_samples(spec, report.samples, report)
    report.warnings.extend(plan.warnings)
    moves = assign.moving(plan.policy)  # groups made whole: the build moves these samples
    if moves is not None:
        report.warnings.append(moves)
    linked = output_folder(spec.output, spec.name).current_release()
    guard(
        spec,
        report,
        planned(plan),
        release_notes.read_before(None if linked is None else linked[1]),
    )
    report.seconds = {**watch.seconds, "total": watch.total()}
    return report


def header_checks(spec: Spec) -> list[str]:
    """What the header probes of ``spec``'s kinds check beyond image headers, each once."""
    from h5etl.plan.kind_registry import kinds_of

    return list(dict.fromkeys(k.header_checks for k in kinds_of(spec) if k.probes_headers))


def unchecked(spec: Spec) -> list[str]:
    """What a dry run without ``--decode`` could not check, by field: what no header shows,
    and the fields that read files no header probe reads."""
    from h5etl.plan.kind_registry import kinds_of

    probed = {k.name for k in kinds_of(spec) if k.probes_headers or k.probe_target()}
    blind = [n for n, f in spec.fields.items() if f.reads_files and n not in probed]
    lines = [
        "pixel and voxel data, mask and label values and JSON sidecars were not checked (no "
        "header shows them): the build may reject more; --dry-run --decode predicts it exactly"
    ]
    if blind:
        shown = ", ".join(f"{n} ({spec.kind_of(n)})" for n in blind)
        lines.append(
            f"fields {shown}: no header probe: only their files' presence was checked without "
            "--decode"
        )
    return lines


def plan_only(
    spec: Spec,
    hook: ProgressHook,
    jobs: int,
    *,
    headers: bool = False,
    discovered: Callable[[int], None] = lambda samples: None,
) -> tuple[BuildReport, Plan, Stopwatch, parent.Parent | None]:
    """Discover and plan. Header probes run only where nothing is decoded after them (a
    dry run): decoding makes every check they make, and they read every file twice."""
    watch = Stopwatch()
    previous, warnings = parent.parent_of(output_folder(spec.output, spec.name))
    hook("discover", 0, None)
    found = discover.find_samples(spec, lambda n: hook("discover", n, None))
    watch.lap("discover")
    timeline.mark("discovered")
    discovered(len(found.samples))
    stage = "probe" if headers else "plan"
    hook(stage, 0, len(found.samples))
    plan = admit.plan(
        spec,
        found.samples,
        lambda n: hook(stage, n, None),
        # Header probes decode headers: the workers' work. Stamps are one stat per file:
        # threads here, so the build does not wait for the workers to start to plan.
        mapper=(
            (lambda fn, batches: mapping.map_in_workers(fn, batches, jobs=jobs))
            if headers
            else (lambda fn, batches: mapping.map_in_threads(fn, batches))
        ),
        headers=headers,
        previous=None if previous is None else previous.split_of(),
    )
    plan.policy["parent"] = None if previous is None else previous.version
    plan.warnings.extend(warnings)
    watch.lap("clean")
    samples = planned(plan)
    report = BuildReport(
        spec.name, found.files_seen, samples, [*found.rejects, *plan.rejects], dict(watch.seconds)
    )
    return report, plan, watch, previous
