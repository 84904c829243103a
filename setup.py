"""One import package, two source roots (docs/architecture.md).

``sloserve`` is a namespace package: the pure core lives in
``shared/sloserve/`` (``sloserve.request``, ``sloserve.policies``, ...), the
shells in ``services/sloserve/`` (``sloserve.services``, the SDK
``sloserve.client`` and the generated wire code ``sloserve.v1``). Directory
names are import names, so mypy and editors follow imports with
``mypy_path = shared:services``. Metadata lives in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

package_dir: dict[str, str] = {"sloserve": "shared/sloserve"}  # top-level core modules
for root in ("shared", "services"):
    for pkg in find_namespace_packages(root, include=["sloserve.*"]):
        if "__pycache__" not in pkg:
            package_dir[pkg] = f"{root}/{pkg.replace('.', '/')}"

setup(packages=sorted(package_dir), package_dir=package_dir)  # package data: pyproject.toml
