"""volumes: read one case (a DICOM series folder, a NIfTI file, a folder of 2-D slices) as a
(z, y, x) volume in the field's dtype, slab by slab, with its spacing, affine and series id.

``open_case(path, form)`` reads only headers (cheap: a mask's shape is checked against its
image before any pixel is decoded); ``Case.read(dtype)`` fills one array slab by slab, so a
case never costs more than itself plus a few slices. Every problem is a ``RejectError``
naming the file and what is wrong. pydicom and nibabel are imported only when a case needs
them (``pip install 'h5etl[medical]'``).

Axis order and geometry, whatever the form: the volume is stored ``(z, y, x)`` = (slice, row,
column); ``spacing`` is (z, y, x) in mm; ``affine`` is nibabel's: it maps the voxel index
(x, y, z) = (column, row, slice) to RAS+ millimetres, so
``nibabel.Nifti1Image(volume.transpose(2, 1, 0), affine)`` is the case again.
"""

from h5etl.inputs.volumes.case import FORMS, Case, CaseHeader, cast_exact
from h5etl.inputs.volumes.opening import detect_form, open_case

__all__ = ["FORMS", "Case", "CaseHeader", "cast_exact", "detect_form", "open_case"]
