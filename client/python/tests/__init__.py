"""Tests of the rollpack package. Under CTest they run against the package
pip-installed into the build folder's venv (client/python/CMakeLists.txt);
ROLLPACK_TEST_INSTALLED=1 makes sure the source tree's copy is not the one
imported (a wrong sys.path would otherwise pass silently)."""

import os

if os.environ.get("ROLLPACK_TEST_INSTALLED") == "1":
    import rollpack

    _SOURCE = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    if os.path.realpath(rollpack.__file__).startswith(_SOURCE + os.sep):
        raise ImportError("ROLLPACK_TEST_INSTALLED=1 but rollpack was imported from the source "
                          "tree (%s), not the installed package" % rollpack.__file__)
