"""The runtime wheel keeps, of qtts_lib's own top-level modules, only the package's `__init__`: the others
(checkpoint, golden, probe, plots, ...) belong to the port and its chapters, and several import torch. Everything
else is in pyproject.toml; an editable install (`make setup`) maps the whole source tree as before."""
from setuptools import setup
from setuptools.command.build_py import build_py


class RuntimeOnly(build_py):
    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if package != "qtts_lib" or m[1] == "__init__"]


setup(cmdclass={"build_py": RuntimeOnly})
