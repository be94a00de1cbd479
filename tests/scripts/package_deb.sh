#!/usr/bin/env bash
# The Debian package (scripts/package.sh): built from BUILD_DIR, its contents and control fields checked, then
# extracted into a scratch folder (dpkg -x; nothing is installed on this machine) where the packaged binary must
# answer --help and --version, load only the libraries it carries or that its Depends name, and serve one chat
# request on the packaged default model.
# Usage: tests/scripts/package_deb.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir=$(realpath "$1")
build=$(realpath "$2")
scratch=$(mktemp -d)
server=""
cleanup() {
  [ -z "$server" ] || kill "$server" 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

package=$("$source_dir/scripts/package.sh" "$build" "$scratch/out" | tail -1)
version=$(sed -n 's/^project(beamline VERSION \([0-9.]*\).*/\1/p' "$source_dir/CMakeLists.txt")
[ "$(basename "$package")" = "beamline_${version}_amd64.deb" ] || fail "package named $(basename "$package")"

field() { dpkg-deb -f "$package" "$1"; }
[ "$(field Package)" = beamline ] || fail "Package: $(field Package)"
[ "$(field Version)" = "$version" ] || fail "Version: $(field Version)"
[ "$(field Architecture)" = amd64 ] || fail "Architecture: $(field Architecture)"
field Depends | grep -q 'libc6' || fail "Depends lacks libc6: $(field Depends)"
dpkg-deb --ctrl-tarfile "$package" | tar -xO ./conffiles | grep -qx /etc/default/beamline ||
  fail "/etc/default/beamline is not a conffile"

contents=$(dpkg-deb -c "$package" | awk '{print $6}')
for path in ./usr/bin/beamline ./usr/lib/beamline/beamline ./usr/lib/beamline/lib/libcpp-httplib.so.0.11 \
            ./usr/lib/beamline/models/beam-nano/model.safetensors ./usr/lib/beamline/models/beam-nano/tokenizer.json \
            ./usr/lib/beamline/models/beam-nano/config.json ./usr/lib/systemd/system/beamline.service \
            ./etc/default/beamline ./usr/share/doc/beamline/README.md ./usr/share/doc/beamline/docs/serving.md \
            ./usr/share/doc/beamline/docs/packaging.md; do
  grep -qx "$path" <<< "$contents" || fail "$path is not in the package"
done

root="$scratch/root"
dpkg -x "$package" "$root"
unit="$root/usr/lib/systemd/system/beamline.service"
grep -qx 'EnvironmentFile=-/etc/default/beamline' "$unit" || fail "the unit does not read /etc/default/beamline"
grep -qx 'ExecStart=/usr/bin/beamline serve $BEAMLINE_ARGS' "$unit" || fail "the unit's ExecStart"
grep -q '^BEAMLINE_ARGS=' "$root/etc/default/beamline" || fail "/etc/default/beamline sets no BEAMLINE_ARGS"
[ "$(readlink "$root/usr/bin/beamline")" = ../lib/beamline/beamline ] || fail "/usr/bin/beamline is not a relative link"

exe="$root/usr/bin/beamline"
libraries=$(ldd "$root/usr/lib/beamline/beamline")
! grep -q 'not found' <<< "$libraries" || fail "unresolved libraries: $libraries"
grep -q "libcpp-httplib.so.0.11 => $root/usr/lib/beamline/lib/" <<< "$libraries" ||
  fail "cpp-httplib is not taken from the package: $libraries"
"$exe" --help | grep -q serve || fail "--help does not list serve"
[ "$("$exe" --version)" = "$version" ] || [ "$("$exe" --version)" = "beamline $version" ] ||
  fail "--version says $("$exe" --version)"

# Served from the scratch folder, so the model can only be the packaged one (found above the binary).
log="$scratch/serve.log"
(cd "$scratch" && exec "$exe" serve --port 0 --device cpu --max-model-len 2048 > "$log" 2>&1) &
server=$!
port=""
for _ in $(seq 600); do
  port=$(sed -n 's|.*at http://[^:]*:\([0-9]*\)/v1.*|\1|p' "$log" | head -1)
  [ -n "$port" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$log" >&2; fail "the packaged server exited before listening"; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$log" >&2; fail "the packaged server did not listen in 60 s"; }
grep -q "$root/usr/lib/beamline/models/beam-nano" "$log" || { cat "$log" >&2; fail "not the packaged model"; }
answer=$(curl -sS --max-time 120 "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8}')
python3 -c 'import json, sys; a = json.loads(sys.argv[1]); assert a["choices"][0]["message"]["role"] == "assistant", a; assert a["usage"]["completion_tokens"] >= 1, a' "$answer" ||
  fail "the chat answer: $answer"
kill -TERM "$server"
wait "$server" || fail "the packaged server did not exit 0 on SIGTERM"
server=""
echo "ok: $(basename "$package"), $(du -h "$package" | cut -f1), Depends: $(field Depends)"
