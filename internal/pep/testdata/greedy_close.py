# Two blocks with nothing between them are one block: the closing line is
# the last "# ///" in the unbroken run of comment lines, so the TOML of the
# "first" block runs into the second.
# /// script
# dependencies = ["a"]
# ///
# /// script
# dependencies = ["b"]
# ///
