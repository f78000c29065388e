#!/usr/bin/env bash
# Doxygen's input filter for kiln's headers (docs/Doxyfile): kiln comments with `//`, Doxygen
# reads `///`. The comment block that opens a file documents the file; a full-line comment
# documents what follows it; section rules (`// --- creation ---`) stay plain comments. kiln's
# comments use no Doxygen commands, so a backslash in one (a regular expression's \S) is text.
exec sed -E \
  -e '1{/^\/\/ /i /// @file
}' \
  -e '/^[[:space:]]*\/\/ ---/b' \
  -e '/^[[:space:]]*\/\/( |$)/{s/\\/\\\\/g;s/^([[:space:]]*)\/\//\1\/\/\//}' \
  "$1"
