#!/bin/sh
# run_python_tests.sh: runs the Python binding's tests (tests/python/test_binding.py, plain unittest).
# Tests that need PyTorch, CUDA or libflashgen.so skip themselves with the reason; the script exits
# 0 when nothing failed, skipped tests included, and prints "python: N passed, N failed, N skipped".
#
#   tests/python/run_python_tests.sh                # from a checkout, after building build/
#   FLASHGEN_LIBRARY=build/libflashgen.so PYTHON=python3.11 tests/python/run_python_tests.sh
#
# Environment: PYTHON (default python3), FLASHGEN_LIBRARY, CC, FLASHGEN_TEST_SOURCE_DIR.
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
if ! command -v "$py" >/dev/null 2>&1; then
  echo "run_python_tests.sh: no Python interpreter '$py'; set PYTHON" >&2
  exit 1
fi
PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
FLASHGEN_TEST_SOURCE_DIR="${FLASHGEN_TEST_SOURCE_DIR:-$root}" \
  exec "$py" "$here/test_binding.py" "$@"
