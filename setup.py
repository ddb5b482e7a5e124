"""The build is pyproject.toml's; this adds one step: the wheel carries patches/ and deepspeed-sdists.lock inside
patch_and_test/, where an installed doctor finds them (patch_and_test.DATA_ROOT) without a checkout."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA = ("patches", "deepspeed-sdists.lock")  # MANIFEST.in puts them in the sdist


class BuildPy(build_py):

    def run(self):
        super().run()
        target = Path(self.build_lib, "patch_and_test")
        for name in DATA:
            if Path(name).is_dir():
                shutil.rmtree(target / name, ignore_errors=True)  # a build folder kept from an earlier build
                shutil.copytree(name, target / name)
            else:
                shutil.copy2(name, target / name)


setup(cmdclass={"build_py": BuildPy})
