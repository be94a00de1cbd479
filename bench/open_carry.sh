# Sourced by the GPU scripts with CARRY set. bench/make_carry.sh ships the programs as one xz stream, because the
# working tree and the carry together must stay under the device tool's 64 MiB; unpack it once, in place.
if [ -s "$CARRY/programs.tar.xz" ] && [ ! -x "$CARRY/apps/beamline/beamline" ]; then
  tar -xJf "$CARRY/programs.tar.xz" -C "$CARRY" || { echo "cannot unpack $CARRY/programs.tar.xz" >&2; exit 1; }
fi
