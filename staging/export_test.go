package staging

// VerifyFile is verifyFile, for the external tests.
var VerifyFile = verifyFile
