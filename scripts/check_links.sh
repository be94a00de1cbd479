#!/usr/bin/env bash
# Checks every relative Markdown link in the docs: the file it names exists, and a #anchor names a heading of it
# (GitHub's slugs: lower case, punctuation dropped, spaces as hyphens). Web links are not fetched.
# Usage: scripts/check_links.sh [FILE.md ...]   (default: README.md, docs/, bench/, models/, tests/data/ READMEs)
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] && files=("$@") || mapfile -t files < <(ls README.md docs/*.md bench/README.md models/*/README.md tests/data/*/README.md 2>/dev/null)
slugs() { grep -E '^#{1,6} ' "$1" | sed -E 's/^#+ //' | tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9 _-]//g; s/ /-/g'; }
bad=0
for file in "${files[@]}"; do
  dir=$(dirname "$file")
  while IFS= read -r link; do
    target=${link%%#*}
    anchor=${link#"$target"}
    anchor=${anchor#\#}
    path=$dir/$target
    [ -z "$target" ] && path=$file
    if [ ! -e "$path" ]; then
      echo "$file: $link: no such file"; bad=1
    elif [ -n "$anchor" ] && ! slugs "$path" | grep -qxF "$anchor"; then
      echo "$file: $link: no heading for #$anchor"; bad=1
    fi
  done < <(grep -oE '\]\([^)[:space:]]+\)' "$file" | sed -E 's/^\]\((.*)\)$/\1/' | grep -vE '^[a-z]+:')
done
[ $bad = 0 ] && echo "links ok in ${#files[@]} files"
exit $bad
