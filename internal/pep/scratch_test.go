package pep

import ("testing"; "strings"; "time")

func TestScratchDeep(t *testing.T) {
	for _, c := range []string{
		"# a = " + strings.Repeat("[", 30000) + "\n",
		"# a = " + strings.Repeat("{b=", 15000) + "\n",
		"# " + strings.Repeat("a.", 30000) + "b = 1\n",
		"# a = \"" + strings.Repeat("\\u00e9", 10000) + "\"\n",
		strings.Repeat("# [[a.b.c]]\n", 5000),
	} {
		code := "# /// script\n" + c + "# ///\n"
		st := time.Now()
		_, err := ParseScriptMetadata(code)
		es := ""
		if err != nil { es = err.Error(); if len(es) > 150 { es = es[:150] } }
		t.Logf("%v %d %s", time.Since(st), len(code), es)
	}
}
