package worker

import (
	"bytes"
	"image/png"
	"strings"
	"testing"
)

// Matplotlib and pandas are only installed for Debian's python3; the tests
// that need them run wherever they can be imported.

// mplEnv is what the Go side sets, plus a DISPLAY under which matplotlib
// would warn that plt.show() cannot show anything.
var mplEnv = []string{"MPLBACKEND=Agg", "DISPLAY=:99"}

func requireModules(t *testing.T, python string, mods ...string) {
	t.Helper()
	requirePython(t, python)
	if !hasModules(python, mods...) {
		t.Skipf("%s cannot import %s", python, strings.Join(mods, ", "))
	}
}

// withModules runs f on every interpreter that can import mods, and skips
// the others.
func withModules(t *testing.T, mods []string, f func(t *testing.T, python string)) {
	for name, python := range interpreters(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			requireModules(t, python, mods...)
			f(t, python)
		})
	}
}

// checkPNG decodes a figure's image and checks it against its metadata.
func checkPNG(t *testing.T, f Figure, width, height int) {
	t.Helper()
	if f.Omitted || len(f.PNG) == 0 {
		t.Fatalf("figure has no data: %+v", f)
	}
	if !bytes.HasPrefix(f.PNG, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("not a PNG: %q", f.PNG[:min(16, len(f.PNG))])
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(f.PNG))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Width != f.Width || cfg.Height != f.Height {
		t.Errorf("PNG is %dx%d, figure says %dx%d", cfg.Width, cfg.Height, f.Width, f.Height)
	}
	if width > 0 && (f.Width != width || f.Height != height) {
		t.Errorf("figure is %dx%d, want %dx%d", f.Width, f.Height, width, height)
	}
}

func TestFigures(t *testing.T) {
	withModules(t, []string{"matplotlib"}, figureCases)
}

func figureCases(t *testing.T, python string) {
	w := startPythonEnv(t, python, false, mplEnv...)

	t.Run("one plot", func(t *testing.T) {
		res, _, stderr := w.run(t, Request{Code: "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\n42"})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, "42")
		if len(res.Figures) != 1 || res.FiguresOmitted != 0 {
			t.Fatalf("figures = %d (+%d omitted), stderr:\n%s", len(res.Figures), res.FiguresOmitted, stderr)
		}
		f := res.Figures[0]
		checkPNG(t, f, 640, 480) // matplotlib's default 6.4x4.8 in at 100 dpi
		if f.DPI != 100 || f.TooLarge || f.Omitted {
			t.Errorf("figure = dpi %v, too large %v, omitted %v", f.DPI, f.TooLarge, f.Omitted)
		}
		if stderr != "" {
			t.Errorf("stderr:\n%s", stderr)
		}
	})

	t.Run("closed after the run", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "plt.get_fignums()"})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, "[]")
		if len(res.Figures) != 0 {
			t.Errorf("%d figures, want none", len(res.Figures))
		}
	})

	t.Run("figure-number order", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "plt.figure(3, figsize=(2, 2))\nplt.plot([1])\nplt.figure(1, figsize=(4, 2), dpi=50)\nplt.plot([2])\n"})
		wantSuccess(t, res)
		if len(res.Figures) != 2 {
			t.Fatalf("%d figures, want 2", len(res.Figures))
		}
		checkPNG(t, res.Figures[0], 200, 100)
		checkPNG(t, res.Figures[1], 200, 200)
		if res.Figures[0].DPI != 50 {
			t.Errorf("dpi = %v, want 50", res.Figures[0].DPI)
		}
	})

	t.Run("show is silent", func(t *testing.T) {
		res, stdout, stderr := w.run(t, Request{Code: "plt.plot([1, 2])\nplt.show()\nplt.gcf().show()\n"})
		wantSuccess(t, res)
		if stdout != "" || stderr != "" {
			t.Errorf("output %q %q", stdout, stderr)
		}
		if len(res.Figures) != 1 {
			t.Errorf("%d figures, want 1", len(res.Figures))
		}
		// Newer matplotlib versions word the warning differently; other
		// warnings still show.
		res, _, stderr = w.run(t, Request{Code: "import warnings\n" +
			"warnings.warn('FigureCanvasAgg is non-interactive, and thus cannot be shown')\nwarnings.warn('other')"})
		wantSuccess(t, res)
		if !strings.Contains(stderr, "UserWarning: other") || strings.Contains(stderr, "FigureCanvasAgg") {
			t.Errorf("stderr:\n%s", stderr)
		}
	})

	t.Run("captured when the run fails", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "plt.plot([1, 2])\n1 / 0\n"})
		wantError(t, res, "ZeroDivisionError", 1)
		if len(res.Figures) != 1 {
			t.Fatalf("%d figures, want 1", len(res.Figures))
		}
		checkPNG(t, res.Figures[0], 640, 480)
	})

	t.Run("not after MemoryError", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "plt.plot([1, 2])\nraise MemoryError\n"})
		wantError(t, res, "MemoryError", 1)
		if len(res.Figures) != 0 {
			t.Errorf("%d figures after MemoryError", len(res.Figures))
		}
		w.run(t, Request{Code: "plt.close('all')"})
	})

	t.Run("rendering errors do not fail the run", func(t *testing.T) {
		res, _, stderr := w.run(t, Request{Code: "a = plt.figure()\nb = plt.figure(figsize=(1, 1))\n" +
			"def boom(*args, **kwargs):\n    raise RuntimeError('cannot render\\nthis')\na.savefig = boom\n'done'"})
		wantSuccess(t, res)
		jsonEqual(t, res.ReturnValue, `"done"`)
		if len(res.Figures) != 1 {
			t.Fatalf("%d figures, want 1", len(res.Figures))
		}
		checkPNG(t, res.Figures[0], 100, 100)
		if stderr != "pysandbox: could not render figure 1: RuntimeError: cannot render this\n" {
			t.Errorf("stderr = %q", stderr)
		}
		res, _, _ = w.run(t, Request{Code: "plt.get_fignums()"})
		jsonEqual(t, res.ReturnValue, "[]")
	})

	t.Run("at most 16", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "for i in range(19):\n    plt.figure(figsize=(1, 1), dpi=20)\n"})
		wantSuccess(t, res)
		if len(res.Figures) != MaxFigures || res.FiguresOmitted != 3 {
			t.Errorf("%d figures, %d omitted; want %d, 3", len(res.Figures), res.FiguresOmitted, MaxFigures)
		}
		for _, f := range res.Figures {
			checkPNG(t, f, 20, 20)
		}
		res, _, _ = w.run(t, Request{Code: "plt.get_fignums()"})
		jsonEqual(t, res.ReturnValue, "[]")
	})

	t.Run("scaled down to fit", func(t *testing.T) {
		res, _, stderr := w.run(t, Request{Code: "import random\nrandom.seed(1)\n" +
			"fig = plt.figure(figsize=(40, 40), dpi=200)\nplt.plot([random.random() for _ in range(3000)])\n"})
		wantSuccess(t, res)
		if len(res.Figures) != 1 {
			t.Fatalf("%d figures, stderr:\n%s", len(res.Figures), stderr)
		}
		f := res.Figures[0]
		checkPNG(t, f, 0, 0)
		if f.DPI >= 200 || f.DPI < MinFigureDPI || f.Width != int(40*f.DPI) {
			t.Errorf("rendered %dx%d at dpi %v", f.Width, f.Height, f.DPI)
		}
		if len(f.PNG) > DefaultMaxFigureBytes && !f.TooLarge {
			t.Errorf("%d bytes, not flagged too large", len(f.PNG))
		}
		t.Logf("40x40 in at 200 dpi: sent %dx%d at dpi %v, %d bytes, too large %v", f.Width, f.Height, f.DPI, len(f.PNG), f.TooLarge)
	})

	t.Run("too large even at the lowest dpi", func(t *testing.T) {
		res, _, _ := w.run(t, Request{Code: "import random\nrandom.seed(2)\n" +
			"plt.figure(figsize=(8, 8))\nplt.imshow([[random.random() for _ in range(200)] for _ in range(200)], interpolation='nearest')\n",
			MaxFigureBytes: 2000})
		wantSuccess(t, res)
		if len(res.Figures) != 1 {
			t.Fatalf("%d figures", len(res.Figures))
		}
		f := res.Figures[0]
		checkPNG(t, f, 0, 0)
		if !f.TooLarge || f.Omitted || len(f.PNG) <= 2000 || f.DPI < MinFigureDPI || f.DPI >= 100 {
			t.Errorf("figure = %dx%d dpi %v, %d bytes, too large %v, omitted %v", f.Width, f.Height, f.DPI, len(f.PNG), f.TooLarge, f.Omitted)
		}
	})

	t.Run("without pyplot nothing happens", func(t *testing.T) {
		w := startPythonEnv(t, python, false, mplEnv...)
		res, _, _ := w.run(t, Request{Code: "import sys\n'matplotlib.pyplot' in sys.modules"})
		jsonEqual(t, res.ReturnValue, "false")
		if res.Figures != nil {
			t.Errorf("figures = %v", res.Figures)
		}
	})
}

func TestFiguresOneshot(t *testing.T) {
	withModules(t, []string{"matplotlib"}, figuresOneshot)
}

func figuresOneshot(t *testing.T, python string) {
	w := startPythonEnv(t, python, true, mplEnv...)
	res, _, _ := w.run(t, Request{Code: "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.show()"})
	wantSuccess(t, res)
	if len(res.Figures) != 1 {
		t.Fatalf("%d figures", len(res.Figures))
	}
	checkPNG(t, res.Figures[0], 640, 480)
	if code := w.exitCode(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

// A figure beyond MaxFigurePNGBytes is described but its data left out.
func TestFigureOmitted(t *testing.T) {
	withModules(t, []string{"matplotlib", "numpy"}, figureOmitted)
}

func figureOmitted(t *testing.T, python string) {
	w := startPythonEnv(t, python, false, mplEnv...)
	// Noise does not compress: 1800x1800 RGB pixels are about 9.7 MB of
	// PNG, and at 20 dpi the figure cannot be scaled down any further.
	res, _, stderr := w.run(t, Request{Code: "import numpy as np, matplotlib.pyplot as plt\n" +
		"fig = plt.figure(figsize=(90, 90), dpi=20)\nfig.figimage(np.random.default_rng(0).random((1800, 1800, 3)))\n" +
		"plt.figure(figsize=(1, 1))\n",
		MaxFigureBytes: 64 << 20})
	wantSuccess(t, res)
	if len(res.Figures) != 2 {
		t.Fatalf("%d figures, stderr:\n%s", len(res.Figures), stderr)
	}
	f := res.Figures[0]
	if !f.Omitted || !f.TooLarge || f.PNG != nil || f.Width != 1800 || f.Height != 1800 || f.DPI != 20 {
		t.Errorf("figure = %dx%d dpi %v, %d bytes, too large %v, omitted %v", f.Width, f.Height, f.DPI, len(f.PNG), f.TooLarge, f.Omitted)
	}
	checkPNG(t, res.Figures[1], 100, 100)
}

func TestReturnText(t *testing.T) {
	for name, python := range interpreters(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := startPython(t, python, false)
			// Not pandas: no text, and pandas is not imported to find out.
			res, _, _ := w.run(t, Request{Code: "import sys\nclass DataFrame:\n    def to_string(self, **kw): return 'fake'\n" +
				"d = DataFrame()\n[d, 'pandas' in sys.modules]"})
			wantSuccess(t, res)
			if res.ReturnText != "" || !strings.HasSuffix(reprValue(t, res), ", False]") {
				t.Errorf("return text %q, value %s", res.ReturnText, res.ReturnValue)
			}
			res, _, _ = w.run(t, Request{Code: "d"})
			if res.ReturnText != "" {
				t.Errorf("return text %q for a non-pandas class", res.ReturnText)
			}
			// A pandas-like object whose to_string fails keeps its repr.
			res, _, _ = w.run(t, Request{Code: "class Broken:\n    def to_string(self, **kw): raise ValueError('no')\n" +
				"    def __repr__(self): return 'Broken()'\nBroken.__module__ = 'pandas.core.frame'\nBroken()"})
			wantSuccess(t, res)
			if res.ReturnText != "" || reprValue(t, res) != "Broken()" {
				t.Errorf("return text %q, value %s", res.ReturnText, res.ReturnValue)
			}
		})
	}
}

func TestReturnTextPandas(t *testing.T) {
	withModules(t, []string{"pandas"}, returnTextPandas)
}

func returnTextPandas(t *testing.T, python string) {
	w := startPython(t, python, false)
	res, _, _ := w.run(t, Request{Code: "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})\ndf"})
	wantSuccess(t, res)
	if want := "   a  b\n0  1  x\n1  2  y"; res.ReturnText != want {
		t.Errorf("return text %q, want %q", res.ReturnText, want)
	}
	if got := reprValue(t, res); !strings.Contains(got, "a  b") {
		t.Errorf("repr = %q", got)
	}

	// A Series has no max_cols.
	res, _, _ = w.run(t, Request{Code: "df['a'] * 10"})
	wantSuccess(t, res)
	if want := "0    10\n1    20"; res.ReturnText != want {
		t.Errorf("series text %q, want %q", res.ReturnText, want)
	}

	// Large frames are elided to 60 rows and 20 columns.
	res, _, _ = w.run(t, Request{Code: "big = pd.DataFrame({'c%d' % i: range(1000) for i in range(50)})\nbig"})
	wantSuccess(t, res)
	lines := strings.Split(res.ReturnText, "\n")
	if len(lines) > 64 || !strings.Contains(res.ReturnText, "...") || strings.Contains(res.ReturnText, "c25") || len(res.ReturnText) > 64<<10 {
		t.Errorf("big frame: %d lines, %d bytes:\n%s", len(lines), len(res.ReturnText), res.ReturnText)
	}

	// Capped at 64 KiB.
	res, _, _ = w.run(t, Request{Code: "pd.DataFrame({'c%d' % i: ['x' * 1000] * 60 for i in range(20)})"})
	wantSuccess(t, res)
	if n := len(res.ReturnText); n > 64<<10 || n < 60<<10 || !strings.HasSuffix(res.ReturnText, "… (truncated)") {
		t.Errorf("wide frame text is %d bytes, ends %q", n, res.ReturnText[max(0, n-20):])
	}
}
