package api

// Limits of the search routes (GET .../files/glob and .../files/grep).
const (
	// SearchDefaultLimit is how many matches a search returns when the
	// request names no limit; SearchMaxLimit is the most it may ask for.
	SearchDefaultLimit = 1000
	SearchMaxLimit     = 10000
	// SearchMaxVisit bounds the directory entries one search walks.
	SearchMaxVisit = 200000
	// GrepMaxFileSize: larger files are skipped by grep (and counted).
	GrepMaxFileSize = 16 << 20
	// GrepMaxBytes bounds the bytes one grep reads: it stops, truncated,
	// before the file that would pass it, so one request cannot read a
	// whole image (SearchMaxVisit files of GrepMaxFileSize each).
	GrepMaxBytes = 256 << 20
	// GrepMaxLineBytes: a matching line is cut to this many bytes.
	GrepMaxLineBytes = 512
)

// GlobResult answers GET /v1/sandboxes/{id}/files/glob: the paths under
// the search root matching the pattern, in lexical order.
type GlobResult struct {
	Matches []string `json:"matches"`
	// Truncated is set when the limit of matches, or SearchMaxVisit
	// entries walked, stopped the search early.
	Truncated bool `json:"truncated,omitempty"`
}

// GrepMatch is one matching line.
type GrepMatch struct {
	Path string `json:"path"`
	Line int    `json:"line"` // 1-based
	Text string `json:"text"` // the line, without its newline, cut to GrepMaxLineBytes
}

// GrepResult answers GET /v1/sandboxes/{id}/files/grep.
type GrepResult struct {
	Matches []GrepMatch `json:"matches"`
	// Files is the number of files searched; Skipped those left out
	// because they are binary or larger than GrepMaxFileSize.
	Files   int `json:"files"`
	Skipped int `json:"skipped,omitempty"`
	// Truncated is set when the limit of matches, SearchMaxVisit entries
	// walked or GrepMaxBytes read stopped the search early.
	Truncated bool `json:"truncated,omitempty"`
}
