package audit

import (
	"bufio"
	"errors"
	"fmt"
	"os"
)

// Anchor is a chain's head as it was written somewhere else (the shared
// store of several replicas): a later chain must still hold the record of
// that seq, with that hash. A chain cut short, or rewritten from an
// earlier point, does not.
type Anchor struct {
	Seq  int64  `json:"seq"`
	Head string `json:"head"`
}

// CheckAnchor checks that the chain in paths (verified already, see
// Verify) holds the anchored record.
func CheckAnchor(paths []string, rep *Report, a Anchor) error {
	if a.Seq > rep.LastSeq {
		return fmt.Errorf("the chain ends at seq %d, but seq %d was anchored: records were cut from its end", rep.LastSeq, a.Seq)
	}
	if a.Seq < rep.FirstSeq {
		// The anchored record was in a file removed since (retention).
		return nil
	}
	hash, err := hashAt(paths, a.Seq)
	if err != nil {
		return err
	}
	if hash != a.Head {
		return fmt.Errorf("seq %d has hash %s, but %s was anchored: the chain was rewritten", a.Seq, hash, a.Head)
	}
	return nil
}

// hashAt is the hash of the record of seq.
func hashAt(paths []string, seq int64) (string, error) {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return "", fmt.Errorf("audit: %w", err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes+1)
		for sc.Scan() {
			r, hash, err := parseLine(sc.Bytes())
			if err == nil && r.Seq == seq {
				f.Close()
				return hash, nil
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return "", fmt.Errorf("audit: %w", err)
		}
	}
	return "", errors.New("the anchored record is not in the chain")
}
