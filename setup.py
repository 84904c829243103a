"""Package layout from the design card: ``shared/`` is ``sloserve`` (the core),
``services/`` is ``sloserve.services`` (the shells), ``services/client`` is
``sloserve.client`` (the SDK). Metadata lives in pyproject.toml."""

from setuptools import find_packages, setup

ROOTS = {
    "sloserve": "shared",
    "sloserve.services": "services",
    "sloserve.client": "services/client",
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for name, path in ROOTS.items():
    package_dir[name] = path
    packages.append(name)
    for sub in find_packages(path):
        if name == "sloserve.services" and sub.split(".")[0] == "client":
            continue
        packages.append(f"{name}.{sub}")
        package_dir[f"{name}.{sub}"] = f"{path}/{sub.replace('.', '/')}"

# The .proto sources travel inside the package so an installed (non-editable)
# sloserve can generate its gRPC code: services/proto.py looks in services/protos.
packages.append("sloserve.services.protos")
package_dir["sloserve.services.protos"] = "protos"

setup(packages=packages, package_dir=package_dir)  # package data: pyproject.toml
