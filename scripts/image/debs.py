#!/usr/bin/env python3
"""debs.py [--skip PKG,...] PKG...: prints `name=version` of PKG and its Depends/Pre-Depends closure,
one a line, sorted, from this machine's apt lists (`apt-cache show`, candidate versions).

Of each alternative group the first alternative that is a real package is taken (as apt does when
nothing is installed); a group whose chosen package is in --skip is dropped with it (the packages
only maintainer scripts need: debconf, perl-base, adduser, ...; dpkg -x never runs those scripts).
Virtual packages are resolved to their first provider. Exits 1 naming an unresolvable dependency."""
import argparse, re, subprocess, sys

ap = argparse.ArgumentParser()
ap.add_argument("--skip", default="")
ap.add_argument("pkgs", nargs="+")
a = ap.parse_args()
skip = set(filter(None, a.skip.split(",")))
cache = {}


def load(names):
    """Fetches the candidate stanzas of `names` in one apt-cache call (virtual/unknown: None)."""
    names = [n for n in names if n not in cache]
    if not names:
        return
    out = subprocess.run(["apt-cache", "show", "--no-all-versions", *names],
                         capture_output=True, text=True).stdout
    for n in names:
        cache[n] = None
    for block in out.split("\n\n"):
        st, key = {}, None
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                st[key] += "\n" + line
            elif ":" in line:
                key, _, v = line.partition(":")
                st[key] = v.strip()
        if st.get("Package") in cache and cache[st["Package"]] is None:
            cache[st["Package"]] = st


def show(name):
    load([name])
    return cache[name]


def providers(name):
    out = subprocess.run(["apt-cache", "showpkg", name], capture_output=True, text=True).stdout
    lines = out.split("Reverse Provides:", 1)[1].splitlines()[1:] if "Reverse Provides:" in out else []
    return [l.split()[0] for l in lines if l.strip()]


def groups(st):
    for field in ("Pre-Depends", "Depends"):
        for g in filter(None, (x.strip() for x in st.get(field, "").split(","))):
            yield [re.sub(r"[\s(\[].*$", "", alt.strip()).split(":")[0] for alt in g.split("|")]


chosen, todo = {}, list(a.pkgs)
while todo:
    load(todo)
    level, todo = todo, []
    for name in level:
        if name in chosen or name in skip:
            continue
        st = show(name)
        if st is None:
            sys.exit(f"debs.py: {name}: no such package")
        chosen[name] = st["Version"]
        gs = list(groups(st))
        load([alt for g in gs for alt in g])
        for g in gs:
            pick = None
            for alt in g:
                if alt in skip or alt in chosen or show(alt):
                    pick = alt
                    break
                real = [p for p in providers(alt) if p in skip or p in chosen or show(p)]
                if real:
                    pick = real[0]
                    break
            if pick is None:
                sys.exit(f"debs.py: {name} depends on {' | '.join(g)}: nothing provides it")
            todo.append(pick)
for n in sorted(chosen):
    print(f"{n}={chosen[n]}")
