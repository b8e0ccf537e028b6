#!/usr/bin/env python3
"""CUDA emulation (tests/gpu/emulation/): rewrites every kernel launch of a .cu file,
`Kernel<<<grid, block, shared, stream>>>(args);`, as
`::cuda_emulation::Launch(dim3(grid), dim3(block), [&]() { Kernel(args); });`, so that the file
compiles as C++ against include/cuda_emulation.h.

    translate_launches.py input.cu output.cc
"""
import sys


def split_top_level(text):
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts]


def translate(src):
    out, pos = [], 0
    while True:
        start = src.find("<<<", pos)
        if start < 0:
            out.append(src[pos:])
            return "".join(out)
        # The callee: back over identifier characters, '::' and template brackets.
        begin, depth = start, 0
        while begin > 0:
            c = src[begin - 1]
            if c == ">":
                depth += 1
            elif c == "<":
                depth -= 1
            elif depth == 0 and not (c.isalnum() or c in "_:"):
                break
            begin -= 1
        callee = src[begin:start]
        end = src.find(">>>", start)
        config = split_top_level(src[start + 3:end])
        if src[end + 3] != "(":
            raise SystemExit("unexpected launch syntax near: " + src[start:end + 20])
        depth, close = 0, end + 3
        while True:
            if src[close] == "(":
                depth += 1
            elif src[close] == ")":
                depth -= 1
                if depth == 0:
                    break
            close += 1
        args = src[end + 4:close]
        out.append(src[pos:begin])
        out.append("::cuda_emulation::Launch(dim3(%s), dim3(%s), [&]() { %s(%s); })"
                   % (config[0], config[1], callee, args))
        pos = close + 1


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        text = f.read()
    with open(sys.argv[2], "w") as f:
        f.write(translate(text))
