package migrate

// UpFS is up on a test's set of files, for the external tests (they
// import pgtest, which imports this package).
var UpFS = up
