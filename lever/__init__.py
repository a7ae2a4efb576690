"""lever: predict, build and check levers of GPU-initiated RDMA over AWS EFA.

Layers, one folder each in the repository, one subpackage each here:
``lever.sim`` (the model and its configuration), ``lever.calibration``
(records, fitting, prediction bands, adjudication), ``lever.hw`` (CUDA kernels
and their harnesses), and this package's own ``cli``, ``commands`` and
``reports`` (the command line, plots, traces, the sweep runner). Imports point
down that list, never up (``tests/test_layers.py`` checks it).
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

# Run from a source checkout without installing (the GPU machine puts the checkout on
# PYTHONPATH): the layer folders beside this one are then the subpackages. An installed
# wheel holds them inside this folder, and an editable install maps them itself.
_root = _Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").is_file() and (_root / "sim" / "__init__.py").is_file():
    __path__.append(str(_root))  # noqa: F821 (a package's __path__)
