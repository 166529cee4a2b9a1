# /// script
#
# ///
