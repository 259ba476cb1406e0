"""The optional C hot path of the record codec (src/dledger/_records.c); everything else is in
pyproject.toml. `optional=True`: where it cannot be compiled, dledger installs and runs on the
pure-Python loops in dledger.entry (docs/performance.md)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("dledger._records", ["src/dledger/_records.c"], libraries=["z"], optional=True),
    ]
)
