// Exception types the native core throws; bindings.cpp maps them onto Python exceptions.
#pragma once

#include <stdexcept>
#include <string>

namespace dart {

// A table file (or an original .trie) is truncated, corrupted, of another version or
// otherwise not what it claims to be. Python sees dart_core._native.FormatError (a
// ValueError); dart_core.ngram re-raises it as NgramFormatError with the fix.
class FormatError : public std::runtime_error {
 public:
  explicit FormatError(const std::string& what) : std::runtime_error(what) {}
};

// A file could not be opened, read or written (permissions, disk full, missing file).
class IoError : public std::runtime_error {
 public:
  explicit IoError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace dart
