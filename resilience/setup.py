"""Maps this folder to the `resilience` package and finds its subpackages (the rest of the
configuration is pyproject.toml): the repository keeps `resilience/` at its top level, so
the library's project folder is the package folder itself, and this file must not ship as
a `resilience.setup` module."""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """build_py without this build script (it lies in the package's folder)."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        modules = super().find_package_modules(package, package_dir)
        return [entry for entry in modules if entry[:2] != ("resilience", "setup")]


setup(
    package_dir={"resilience": "."},
    packages=["resilience", *(f"resilience.{name}" for name in find_packages("."))],
    cmdclass={"build_py": BuildPy},
)
