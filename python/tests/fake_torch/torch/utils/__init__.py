# No cpp_extension here: the helper's "auto" mode must fall back to polling.
