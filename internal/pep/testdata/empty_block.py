# A block needs at least one content line, so this is not a block at all
# (the reference regular expression does not match it).
# /// script
# ///
