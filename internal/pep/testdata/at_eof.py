print("the closing line may be the last line, without a newline")
# /// script
# dependencies = ["rich"]
# ///