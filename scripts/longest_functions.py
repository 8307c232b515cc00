#!/usr/bin/env python3
"""The longest C functions of daemon/, client/ and proto/ at a git revision
(lines from the opening brace at column 0 to the closing one), for
before/after comparisons of a restructuring:

    scripts/longest_functions.py b2b64e2
    scripts/longest_functions.py HEAD
    scripts/longest_functions.py HEAD 80     (every function over 80 lines, and how many)
"""
import re,sys,subprocess
rev=sys.argv[1] if len(sys.argv) > 1 else "HEAD"
over=int(sys.argv[2]) if len(sys.argv) > 2 else None
files=subprocess.run(["git","ls-tree","-r","--name-only",rev,"daemon/","client/","proto/"],capture_output=True,text=True).stdout.split()
out=[]
for f in files:
    if not f.endswith(".c"): continue
    src=subprocess.run(["git","show",f"{rev}:{f}"],capture_output=True,text=True).stdout.split("\n")
    start=None;name=None
    for i,l in enumerate(src):
        if start is None and l=="{" and i>0:
            # find function name in previous lines
            j=i-1
            while j>=0 and "(" not in src[j]: j-=1
            m=re.search(r"(\w+)\s*\(",src[j]) if j>=0 else None
            if m: start=i;name=m.group(1)
        elif start is not None and l=="}":
            out.append((i-start+1,f"{f}:{name}"));start=None
out.sort(reverse=True)
tot=sum(1 for f in files if f.endswith(".c"))
print(rev, "files", tot)
for n,fn in (out[:8] if over is None else [x for x in out if x[0] > over]): print(n,fn)
if over is not None: print(sum(1 for x in out if x[0] > over), "functions over", over, "lines")
