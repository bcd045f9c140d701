"""Packaging beyond pyproject.toml's metadata: the shipped data at the top of the source tree
(recipes/, studies/, calib_data/, evals/) goes into the wheel as package data, quantkit/_data/NAME.

setuptools' `package_dir` maps a package name to any directory, and `package_data` names the files
it carries; pyproject.toml cannot say this beside automatic package discovery, so the package list
is found here (every quantkit package) plus one mapped package per data directory. quantkit's
resource lookup (quantkit/resources.py) reads quantkit/_data/NAME through importlib.resources in a
wheel and the top-level directory itself in a checkout.
"""

from setuptools import find_packages, setup

# each directory that holds shipped files (a subdirectory too: setuptools treats every directory as
# a package), and the files it carries
DATA = {
    "recipes": ["*.yaml"],
    "studies": ["*.yaml"],
    "calib_data": ["*.yaml", "*.md", "*.txt"],
    "calib_data/mix": ["*.yaml"],
    "calib_data/text": ["*.txt"],
    "evals": ["*.yaml", "*.md"],
    "evals/data": ["*.jsonl"],
}


def _package(directory: str) -> str:
    return "quantkit._data." + directory.replace("/", ".")


setup(
    packages=find_packages(include=["quantkit", "quantkit.*"]) + [_package(d) for d in DATA],
    package_dir={_package(d): d for d in DATA},
    package_data={_package(d): globs for d, globs in DATA.items()},
)
