// `rollpack put`, `pool`, `step`, ... are the Python package's
// (client/python/rollpack/__main__.py): the binary finds an interpreter and
// the package and execs `python -m rollpack` with argv as given, wherever
// the binary was built, copied or installed (docs/operations.md,
// "Controller").
//
// The interpreter: $ROLLPACK_PYTHON when set (used as given); else the first
// of the active venv's python3 ($VIRTUAL_ENV/bin/python3), each python3 on
// PATH, and /usr/bin/python3 that can import grpc (a python3 first on PATH
// may lack the packages: a pyenv build beside Debian's); else
// /usr/bin/python3.
// The package: the interpreter's own (pip-installed) when it has one; else
// <dir of the binary>/../lib/rollpack/python (what `cmake --install` lays
// out, and what the build folder links to the source's client/python);
// else the source checkout the binary was built from.
#ifndef ROLLPACK_CLI_PYTHON_FORWARD_H_
#define ROLLPACK_CLI_PYTHON_FORWARD_H_

#include <string>
#include <vector>

namespace rollpack {

struct PythonChoice {
  std::string interpreter;
  // Prepended to PYTHONPATH; "" = the interpreter finds the package itself.
  std::string package_dir;
  // Why it could not be chosen (an unusable $ROLLPACK_PYTHON); "" = fine.
  std::string error;
};

// What ForwardToPython would run, from the environment and the binary's
// path (`self`, /proc/self/exe).
PythonChoice ChoosePython(const std::string& self, const std::string& built_from);

// Execs `python -m rollpack argv...`; returns only on failure (127, after
// saying why on stderr).
int ForwardToPython(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_PYTHON_FORWARD_H_
