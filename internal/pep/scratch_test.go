package pep

import ("testing"; "strings"; "time"; "fmt")

func rep(f string, n int) string { var b strings.Builder; for i := 0; i < n; i++ { fmt.Fprintf(&b, f, i) }; return b.String() }

func TestScratchDeep(t *testing.T) {
	for name, c := range map[string]string{
		"dotted1000": "# " + strings.Repeat("a.", 1000) + "b = 1\n",
		"dotted2000": "# " + strings.Repeat("a.", 2000) + "b = 1\n",
		"dotted4000": "# " + strings.Repeat("a.", 4000) + "b = 1\n",
		"inl1000": "# a = " + strings.Repeat("{b=", 1000) + "1" + strings.Repeat("}", 1000) + "\n",
		"inl2000": "# a = " + strings.Repeat("{b=", 2000) + "1" + strings.Repeat("}", 2000) + "\n",
		"inl4000": "# a = " + strings.Repeat("{b=", 4000) + "1" + strings.Repeat("}", 4000) + "\n",
		"tables": rep("# [t%d]\n", 7000),
		"keys": rep("# k%d = 1\n", 6000),
		"bigarray": "# a = [" + strings.Repeat("1,", 30000) + "]\n",
		"biginline": "# a = {" + rep("k%d=1,", 6000) + "z=1}\n",
		"dottedkeys": rep("# a.k%d = 1\n", 5000),
		"deeptables": rep("# [a.b.c.d.e.f.t%d]\n", 3000),
		"aot": rep("# [[a.b]]\n# x%d = 1\n", 3000),
		"arrofinl": "# a = [" + rep("{k%d=1},", 5000) + "]\n",
		"nestedarr": "# a = " + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + "\n",
		"quotedkeys": "# " + strings.Repeat(`"a".`, 3000) + "b = 1\n",
	} {
		code := "# /// script\n" + c + "# ///\n"
		st := time.Now()
		_, err := ParseScriptMetadata(code)
		es := ""
		if err != nil { es = err.Error(); if len(es) > 100 { es = es[:100] } }
		t.Logf("%-12s %12v %6d %s", name, time.Since(st), len(code), es)
	}
}
