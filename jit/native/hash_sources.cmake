# Writes a C++ source defining a string constant: the SHA-256 of the given files' contents
# (cmake -P, no external tools).   -DINPUTS=<file>[,<file>...] -DOUTPUT=<file.cpp> -DSYMBOL=<name>
string(REPLACE "," ";" files "${INPUTS}")
set(digests "")
foreach(file IN LISTS files)
  file(SHA256 "${file}" digest)
  string(APPEND digests "${digest}")
endforeach()
string(SHA256 combined "${digests}")
file(WRITE "${OUTPUT}" "// Generated from the sources this hash identifies; do not edit.\nextern const char ${SYMBOL}[] = \"${combined}\";\n")
