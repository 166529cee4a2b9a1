# /// script
# dependencies = ["requests", { name = "rich" }]
# ///
