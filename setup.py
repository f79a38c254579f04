# Metadata lives in pyproject.toml; this file declares the one native part setuptools builds.
from setuptools import Extension, setup

setup(
    # The simulator's event loop in C++ (taccl/native/simcore.cpp), loaded with ctypes. Optional: where it
    # does not compile, the install goes on and `taccl.simulator` runs its Python implementation.
    ext_modules=[Extension("taccl._simcore", ["taccl/native/simcore.cpp"], language="c++", optional=True,
                           extra_compile_args=["-std=c++17", "-O2", "-ffp-contract=off"])],
)
