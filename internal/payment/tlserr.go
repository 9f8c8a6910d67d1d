package payment

import (
	"crypto/tls"
	"errors"
)

// tlsRejected reports whether err is a TLS handshake that failed on our
// side: the provider's certificate does not verify against the roots
// (system or Config.TLS.RootCAs) or does not name the host, or the server
// answered with something that is not TLS as its first record (then
// crypto/tls sets RecordHeaderError.Conn; a broken record later, after the
// request may have been sent, is an unknown outcome and stays Transient):
// an HTTP server at an https URL is one, on both engines (the NetHTTP
// engine calls the Transport itself, without http.Client's rewording of
// that error). No request was sent, and every event would
// fail alike until the configuration (BILLING_PAYMENT_URL,
// BILLING_PAYMENT_CA_FILE) or the provider's certificate is fixed: it is
// Systemic, a pause, like a 401, and not Transient, which would dead-letter
// each event as exhausted until enough had failed to call it an outage.
func tlsRejected(err error) bool {
	var (
		verify *tls.CertificateVerificationError
		record tls.RecordHeaderError
	)
	return errors.As(err, &verify) || errors.As(err, &record) && record.Conn != nil
}
