#!/usr/bin/env bash
# `beamline logits` with the parallel flags (one command: it starts its ranks under mpirun itself) writes the logits of
# one process, on a random tiny checkpoint: TP2, and PP2 x TP2 with expert parallelism (max |difference| <= 1e-5 x
# max |logit|). Usage: logits_cli_matches.sh BEAMLINE_EXE
set -euo pipefail
exe=${1:?usage: logits_cli_matches.sh BEAMLINE_EXE}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$exe" make-model --preset tiny --out "$dir/tiny" --seed 5 >/dev/null
tokens=1,17,300,42,7,99,256,3,511,12,64,128
"$exe" logits --model "$dir/tiny" --tokens "$tokens" --out "$dir/one.npy" --device cpu
for flags in "--tensor-parallel-size 2" "--pipeline-parallel-size 2 --tensor-parallel-size 2 --enable-expert-parallel"; do
  rm -f "$dir/many.npy"
  # shellcheck disable=SC2086
  "$exe" logits --model "$dir/tiny" --tokens "$tokens" --out "$dir/many.npy" --device cpu $flags
  python3 - "$dir/one.npy" "$dir/many.npy" "$flags" <<'PY'
import array, struct, sys

def load(path):  # float32 .npy, format version 1
    data = open(path, 'rb').read()
    assert data[:8] == b'\x93NUMPY\x01\x00', path
    header_length = struct.unpack('<H', data[8:10])[0]
    values = array.array('f')
    values.frombytes(data[10 + header_length:])
    return values

one, many = load(sys.argv[1]), load(sys.argv[2])
assert len(one) == len(many) > 0, (len(one), len(many))
worst = max(abs(a - b) for a, b in zip(one, many))
scale = max(abs(a) for a in one)
print(f'{sys.argv[3]}: {len(one)} logits, max |difference| {worst:.3g} = {worst / scale:.3g} of max |logit| {scale:.3g}')
sys.exit(0 if worst <= 1e-5 * scale else 1)
PY
done
