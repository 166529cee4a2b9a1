# /// script
#dependencies = ["requests"]
# ///
