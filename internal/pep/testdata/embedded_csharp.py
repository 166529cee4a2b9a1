# The example from PEP 723: lines that look like "# ///" inside the block
# do not close it; the last one in the run of comment lines does.
# /// script
# embedded-csharp = """
# /// <summary>
# /// text
# ///
# /// </summary>
# public class MyClass { }
# """
# ///
