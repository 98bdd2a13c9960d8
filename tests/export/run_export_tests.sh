#!/bin/sh
# run_export_tests.sh: the install and embedding checks of issue 5, no GPU: `cmake --install`
# into a clean prefix; examples/embed, copied out of the tree, configured with find_package
# against that prefix and built (its kernels exported at build time by the installed flashgen);
# its link line, symbols and ldd show the runtime only (no Lua, SQLite or NVRTC); it runs forward
# and backward on the fake driver (tests/fake_cuda), with no NVRTC, and prints PASS, and so does
# its Hopper build (FLASHGEN_EMBED_HOPPER: exported TMA kernels); the pkg-config files and the
# Python package.
#
# Environment (set by tests/CMakeLists.txt): FLASHGEN_TEST_SOURCE_DIR, FLASHGEN_BUILD_DIR,
# CMAKE (the cmake command), CC. Prints "N passed, N failed"; exit status 0 when none failed.
set -u
SRC=${FLASHGEN_TEST_SOURCE_DIR:?set FLASHGEN_TEST_SOURCE_DIR}
BUILD=${FLASHGEN_BUILD_DIR:?set FLASHGEN_BUILD_DIR}
CMAKE=${CMAKE:-cmake}
CC=${CC:-cc}
T=$(mktemp -d /tmp/fg_export_sh_XXXXXX)
trap 'rm -rf "$T"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; [ -n "${2:-}" ] && [ -f "$2" ] && sed 's/^/    /' "$2" | tail -40; }

PREFIX=$T/prefix
if "$CMAKE" --install "$BUILD" --prefix "$PREFIX" >"$T/install.log" 2>&1; then ok "cmake --install into a clean prefix"
else bad "cmake --install" "$T/install.log"; echo "$passed passed, $failed failed"; exit 1; fi
for f in bin/flashgen include/flashgen.h include/flashgen_export.h lib/libflashgen.a \
         lib/libflashgen_runtime.a lib/libflashgen.so lib/cmake/flashgen/flashgenConfig.cmake \
         lib/cmake/flashgen/flashgenConfigVersion.cmake lib/pkgconfig/flashgen.pc \
         lib/pkgconfig/flashgen-runtime.pc share/flashgen/python/flashgen/__init__.py; do
  [ -e "$PREFIX/$f" ] || bad "installed $f missing"
done
if [ -e "$PREFIX/share/flashgen/python/flashgen/libflashgen.so" ]; then ok "python package with libflashgen.so next to it"
else bad "share/flashgen/python/flashgen/libflashgen.so does not resolve"; fi

PY=${PYTHON:-python3}
if command -v "$PY" >/dev/null 2>&1; then
  if PYTHONPATH="$PREFIX/share/flashgen/python" "$PY" -c 'import flashgen, sys; p = flashgen.library_path(); sys.exit(0 if p.endswith("share/flashgen/python/flashgen/libflashgen.so") else 1)' >"$T/py.log" 2>&1; then
    ok "the installed Python package loads the installed libflashgen.so"
  else bad "the installed Python package" "$T/py.log"; fi
fi

# The runtime library alone references no Lua, SQLite or NVRTC symbol.
if nm -u "$PREFIX/lib/libflashgen_runtime.a" 2>/dev/null | grep -E ' (lua_|luaL_|sqlite3_|nvrtc)' >"$T/nm_rt.txt"; then
  bad "libflashgen_runtime.a references Lua/SQLite/NVRTC symbols" "$T/nm_rt.txt"
else ok "libflashgen_runtime.a: no lua_/sqlite3_/nvrtc references"; fi
# ... nor the generator, the cache or the JIT loader: it is runtime/ with the empty loader.
if nm -u "$PREFIX/lib/libflashgen_runtime.a" 2>/dev/null | grep -E ' (fg_generator_|fg_cache_|fg_nvrtc_|fg_context_generator|fg_context_cache)' >"$T/nm_rt2.txt"; then
  bad "libflashgen_runtime.a references the generator, the cache or the JIT" "$T/nm_rt2.txt"
else ok "libflashgen_runtime.a: no generator/cache/JIT references"; fi
nm -A "$PREFIX/lib/libflashgen_runtime.a" 2>/dev/null | grep ' T fg_builtin_loader$' >"$T/ld_rt.txt"
nm -A "$PREFIX/lib/libflashgen.a" 2>/dev/null | grep ' T fg_builtin_loader$' >"$T/ld_full.txt"
if [ "$(wc -l <"$T/ld_rt.txt")" = 1 ] && grep -q 'loader_none' "$T/ld_rt.txt" &&
   [ "$(wc -l <"$T/ld_full.txt")" = 1 ] && grep -q 'loader\.c' "$T/ld_full.txt"; then
  ok "one loader per library: loader_none in flashgen_runtime, jit/loader.c in flashgen"
else cat "$T/ld_full.txt" >>"$T/ld_rt.txt"; bad "fg_builtin_loader is not defined once per library" "$T/ld_rt.txt"; fi

# The example, out of the source tree, against the prefix only.
cp -r "$SRC/examples/embed" "$T/embed-src"
if "$CMAKE" -S "$T/embed-src" -B "$T/eb" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release \
     >"$T/configure.log" 2>&1 &&
   "$CMAKE" --build "$T/eb" --verbose >"$T/build.log" 2>&1; then ok "examples/embed builds against the installed package"
else bad "examples/embed build" "$T/build.log"; [ -f "$T/build.log" ] || bad "configure" "$T/configure.log"; fi
EXE=$T/eb/flashgen_embed
if [ -x "$EXE" ]; then
  if grep -rqF "$SRC" "$T/eb/CMakeCache.txt" "$T/build.log" "$T/eb"/*.ninja "$T/eb"/Makefile 2>/dev/null; then
    bad "the example's build reaches into the source tree ($SRC)"
  else ok "the example's build does not reach into the source tree"; fi
  grep -E 'flashgen_embed( |$)|-o flashgen_embed' "$T/build.log" | grep -E 'libflashgen|-lflashgen' >"$T/link.txt"
  if grep -q 'libflashgen_runtime.a' "$T/link.txt" && ! grep -Eq 'libflashgen\.(a|so)|lua|sqlite|nvrtc' "$T/link.txt"; then
    ok "link line: libflashgen_runtime.a only"
  else bad "link line" "$T/link.txt"; fi
  if nm "$EXE" | grep -E ' (lua_|luaL_|sqlite3_|nvrtc)' >"$T/nm.txt"; then bad "symbols of Lua/SQLite/NVRTC in the example" "$T/nm.txt"
  else ok "nm: no lua_/sqlite3_/nvrtc symbols in the example"; fi
  if ldd "$EXE" | grep -Ei 'lua|sqlite|nvrtc|libcuda' >"$T/ldd.txt"; then bad "ldd of the example" "$T/ldd.txt"
  else ok "ldd: no Lua, SQLite, NVRTC or libcuda"; fi
  # Run it on the fake driver: the whole exported path, no GPU.
  if "$CC" -std=c11 -D_POSIX_C_SOURCE=200809L -O1 -shared -fPIC -o "$T/libcuda_fake.so" \
       "$SRC/tests/fake_cuda/libcuda.c" -lm 2>"$T/fake.log"; then
    if FLASHGEN_CUDA_LIBRARY="$T/libcuda_fake.so" FLASHGEN_NVRTC_LIBRARY=/nonexistent "$EXE" \
         >"$T/run.log" 2>&1 &&
       grep -q '^7 passed, 0 failed: PASS' "$T/run.log" &&
       grep -q "binary: the exported table 'embed:" "$T/run.log"; then ok "the example passes on the fake driver"
    else bad "the example on the fake driver" "$T/run.log"; fi
    # The backward part: two problems, each dQ, dK and dV checked, and the missing head_dim.
    if [ "$(grep -c '^backward: ' "$T/run.log")" -eq 2 ] &&
       [ "$(grep -cE '^  d[QKV]: max error .*: PASS$' "$T/run.log")" -eq 6 ] &&
       grep -q '^backward head_dim 96 (not exported): FG_ERROR_KERNEL_MISSING as expected: PASS' "$T/run.log"
    then ok "the example's backward (fg_attention_backward from the exported table) on the fake driver"
    else bad "the example's backward on the fake driver" "$T/run.log"; fi
  else bad "building the fake driver" "$T/fake.log"; fi
  # With no driver at all: a clear message, exit 1.
  if FLASHGEN_CUDA_LIBRARY=/nonexistent/libcuda.so.1 "$EXE" >"$T/nodrv.log" 2>&1; then bad "ran without a driver" "$T/nodrv.log"
  elif grep -q 'fg_context_create' "$T/nodrv.log"; then ok "without a driver: a clear failure"
  else bad "without a driver" "$T/nodrv.log"; fi
  # The same exported C through pkg-config, with a plain compiler line.
  if command -v pkg-config >/dev/null 2>&1; then
    FLAGS=$(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" pkg-config --cflags --libs flashgen-runtime)
    if "$CC" -std=c11 -Wall -Wextra -Werror -I"$T/eb/gen" "$T/embed-src/main.c" "$T/eb/gen/embed_kernels.c" \
         $FLAGS -o "$T/embed_pc" >"$T/pc.log" 2>&1; then ok "pkg-config flashgen-runtime links the example"
    else bad "pkg-config build" "$T/pc.log"; fi
  fi
fi

# The example with the Hopper kernels (-DFLASHGEN_EMBED_HOPPER=ON: variants_hopper.txt, sm_90a
# TMA kernels, whose tensor maps the runtime encodes for an exported plan too) on the fake driver
# (compute capability 9.0; FAKE_CUDA_EXACT: its planted errors off), with no NVRTC: 12 checks, every
# problem run by a kernel with tensor maps.
if [ -f "$T/libcuda_fake.so" ] &&
   "$CMAKE" -S "$T/embed-src" -B "$T/ebh" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release \
     -DFLASHGEN_EMBED_HOPPER=ON >"$T/configure_h.log" 2>&1 &&
   "$CMAKE" --build "$T/ebh" >"$T/build_h.log" 2>&1; then
  if FAKE_CUDA_EXACT=1 FLASHGEN_CUDA_LIBRARY="$T/libcuda_fake.so" FLASHGEN_NVRTC_LIBRARY=/nonexistent \
       "$T/ebh/flashgen_embed" >"$T/run_h.log" 2>&1 &&
     grep -q '^12 passed, 0 failed: PASS' "$T/run_h.log" && ! grep -q 'not a Hopper TMA plan' "$T/run_h.log" &&
     [ "$(grep -c '^backward: ' "$T/run_h.log")" -eq 4 ]; then
    ok "the example with the Hopper kernels (exported TMA plans, d = 64, 128, 256) on the fake driver"
  else bad "the example with the Hopper kernels on the fake driver" "$T/run_h.log"; fi
else bad "examples/embed with FLASHGEN_EMBED_HOPPER=ON" "$T/build_h.log"; [ -f "$T/build_h.log" ] || bad "configure" "$T/configure_h.log"; fi

# flashgen::flashgen (everything, static Lua and SQLite by absolute path) links from the prefix.
mkdir -p "$T/full"
cat >"$T/full/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(fg_full_consumer C)
find_package(flashgen 0.1 REQUIRED CONFIG)
add_executable(full main.c)
target_link_libraries(full PRIVATE flashgen::flashgen)
CM
cat >"$T/full/main.c" <<'C'
#include <stdio.h>
#include <flashgen.h>
int main(void) { printf("flashgen %s\n", fg_version()); return 0; }
C
if "$CMAKE" -S "$T/full" -B "$T/fb" -DCMAKE_PREFIX_PATH="$PREFIX" >"$T/full.log" 2>&1 &&
   "$CMAKE" --build "$T/fb" >>"$T/full.log" 2>&1 && "$T/fb/full" | grep -q '^flashgen '; then
  ok "find_package(flashgen) -> flashgen::flashgen links and runs"
else bad "flashgen::flashgen consumer" "$T/full.log"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
