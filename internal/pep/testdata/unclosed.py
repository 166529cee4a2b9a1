# /// script
# dependencies = ["requests"]

print("the comment run ended before any closing line")
# ///
