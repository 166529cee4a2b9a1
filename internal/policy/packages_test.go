package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestPackageRules(t *testing.T) {
	p, err := Parse([]byte(`{"version":"1","packages":{"allow":["numpy","Pandas_*","pysbx-?lpha"],"deny":["*miner*","pandas-evil"]}}`), "p.json", testTools)
	if err != nil {
		t.Fatal(err)
	}
	r := p.Packages
	for name, want := range map[string]string{
		"numpy":        "",
		"NumPy":        "",
		"pandas-stubs": "",
		"pandas.stubs": "",
		"pysbx_alpha":  "",
		"pandas":       `not allowed by the policy: packages.allow lists only numpy, pandas-*, pysbx-?lpha`,
		"requests":     `package "requests" is not allowed`,
		"pandas-evil":  `refused by the policy rule packages.deny "pandas-evil"`,
		"Pandas_Evil":  `package "pandas-evil" is refused`,
		"crypto-miner": `packages.deny "*miner*"`,
		"numpy-miner":  `packages.deny "*miner*"`,
		"pysbx-beta":   "not allowed",
	} {
		err := r.Check(name)
		if want == "" {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		var pe *PackageError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", name, err, want)
		}
	}
	// Installed dependencies meet only the deny rules.
	if err := r.CheckInstalled("python-dateutil"); err != nil {
		t.Errorf("a dependency not on the allow list: %v", err)
	}
	if err := r.CheckInstalled("bit_miner"); err == nil {
		t.Error("a denied dependency passed")
	}
	if !(PackageRules{}).Empty() || r.Empty() {
		t.Error("Empty")
	}
}
