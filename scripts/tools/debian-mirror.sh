#!/bin/bash
# Prints the Debian archive URI this machine's apt uses, from either source
# format (deb822 /etc/apt/sources.list.d/*.sources, or one-line sources.list),
# for the tool builds' private apt lists. Exit 1 with a message when none.
set -uo pipefail
uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/{print $2}' | grep -v -- '-security' | head -1)
[[ -n $uri ]] || uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
  awk '$1=="deb"{for(i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' | grep -v -- '-security' | head -1)
[[ -n $uri ]] || { echo "debian-mirror: no Debian archive in /etc/apt/sources.list(.d)" >&2; exit 1; }
echo "$uri"
