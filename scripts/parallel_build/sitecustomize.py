"""On PYTHONPATH for a build of Transformer Engine's JAX extension (scripts/te_check_env.sh, te_gpu_install.sh) only:
TE's setup.py compiles its 19 C++ sources one after another, and pybind11's ParallelCompile, installed here before
the build starts, runs one compiler per core (3 min 37 s -> 1 min 46 s on 2 cores, 2026-11-29)."""
import warnings

warnings.filterwarnings("ignore", "Setuptools is replacing distutils")  # setuptools' own shim, imported by pybind11

from pybind11.setup_helpers import ParallelCompile  # noqa: E402

ParallelCompile(default=0).install()  # default 0: as many compilers as cores
