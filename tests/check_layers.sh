#!/bin/sh
# check_layers.sh: no include runs upward (DESIGN.md, "Folders and what each owns"): core/
# includes nothing of ours but core/ and the public flashgen.h; generator/ and cache/ include no
# runtime/ or jit/ header; runtime/ includes no generator/, cache/ or jit/ header. The build's
# include paths enforce the same; this names the offending line when someone widens them.
set -u
SRC=${FLASHGEN_TEST_SOURCE_DIR:?set FLASHGEN_TEST_SOURCE_DIR to the source tree}
failed=0
headers() { (cd "$SRC" && ls $1 2>/dev/null | xargs -n1 basename); }
# check FOLDER ALLOWED-HEADERS...: every quoted include of FOLDER names one of the allowed headers.
check() {
  folder=$1; shift
  allowed=$(printf '%s\n' "$@")
  grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$SRC/$folder"/*.c "$SRC/$folder"/*.h 2>/dev/null |
    while IFS= read -r line; do
      h=$(printf '%s' "$line" | sed 's/.*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/')
      if ! printf '%s\n' "$allowed" | grep -qx "$h"; then
        echo "FAILED: $line: $folder/ may not include \"$h\" (see DESIGN.md, folders)"
        echo x
      fi
    done
}
CORE=$(headers 'core/*.h')
out=$( { check core $CORE flashgen.h
         check generator $CORE flashgen.h $(headers 'generator/*.h') fg_templates.h
         check cache $CORE flashgen.h $(headers 'cache/*.h')
         check runtime $CORE flashgen.h flashgen_export.h fg_params.h $(headers 'runtime/*.h'); } )
if printf '%s\n' "$out" | grep -q '^x$'; then
  printf '%s\n' "$out" | grep -v '^x$'
  exit 1
fi
echo "ok: core/, generator/, cache/ and runtime/ include nothing above them"
