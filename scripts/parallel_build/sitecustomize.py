"""Compiles a setuptools build's C++ sources one per core (pybind11's ParallelCompile), for Transformer Engine's JAX
extension: on PYTHONPATH for that `pip wheel` only (scripts/te_check_env.sh, te_gpu_install.sh). TE's setup.py alone
compiles its 19 sources one after another (3 min 37 s -> 1 min 46 s on 2 cores, 2026-11-29). MAX_JOBS, when set,
caps the compilers; else one per core."""
import warnings

warnings.filterwarnings("ignore", "Setuptools is replacing distutils")  # setuptools' own shim, imported by pybind11

from pybind11.setup_helpers import ParallelCompile  # noqa: E402

ParallelCompile("MAX_JOBS", default=0).install()  # default 0: as many compilers as cores
