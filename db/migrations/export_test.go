package migrations

// Hooks for the external tests (migrations_test imports pgtest, which
// imports this package).
var (
	UpFS           = up
	LowestBinaries = lowestBinaries
	Embedded       = files
)
