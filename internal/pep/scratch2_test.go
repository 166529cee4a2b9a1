package pep

import ("testing"; "encoding/json"; "os"; "strings")

func TestScratchSpec(t *testing.T) {
	data, _ := os.ReadFile("/tmp/casesspec.json")
	var d struct {
		Cases []struct{ Spec string; Valid bool; V string; In bool } `json:"cases"`
		Vers []string `json:"vers"`
		Norm map[string]string `json:"norm"`
		Cmp [][]int `json:"cmp"`
	}
	if err := json.Unmarshal(data, &d); err != nil { t.Fatal(err) }
	bad := 0
	for _, c := range d.Cases {
		ss, err := ParseSpecifierSet(c.Spec)
		if strings.Contains(c.Spec, "~=v") || strings.Contains(c.Spec, "===") { continue }; if (err == nil) != c.Valid { bad++; if bad < 20 { t.Errorf("%q valid=%v err=%v", c.Spec, c.Valid, err) }; continue }
		if err != nil { continue }
		if got := ss.Contains(c.V); got != c.In { bad++; if bad < 20 { t.Errorf("%q contains %q = %v want %v", c.Spec, c.V, got, c.In) } }
	}
	for i, a := range d.Vers {
		va, err := ParseVersion(a); if err != nil { t.Fatal(err) }
		if va.String() != d.Norm[a] { t.Errorf("norm %q = %q want %q", a, va.String(), d.Norm[a]) }
		for j, b := range d.Vers {
			vb, _ := ParseVersion(b)
			if c := va.Compare(vb); c != d.Cmp[i][j] { t.Errorf("cmp %q %q = %d want %d", a, b, c, d.Cmp[i][j]) }
		}
	}
	t.Logf("%d cases, %d bad", len(d.Cases), bad)
}
