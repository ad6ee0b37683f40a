"""The one compiled part of the Python package: the evidence reducer's C kernels
(native/evidence/), a plain shared library loaded with ctypes
(failslow/detectors/slowdown/kernel.py). Optional: without a C compiler the package installs
and the numpy forms run instead. Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "failslow.detectors.slowdown._evidence",
    sources=["native/evidence/gaps.c", "native/evidence/rounds.c"],
    extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror",
                        "-fvisibility=hidden"],
    libraries=["m"],
    optional=True,
)])
