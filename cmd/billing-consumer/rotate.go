package main

import (
	"log/slog"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/payment"
)

// secretReread is how often the running service re-reads the mounted
// secret files (BILLING_PAYMENT_TOKEN_FILE, BILLING_KAFKA_SASL_PASSWORD_FILE)
// at most: a rotated secret is used within about this long, without a
// restart. The kubelet itself refreshes a mounted secret within about a
// minute of its change.
const secretReread = 5 * time.Second

// paymentAuth returns the Authorization source and the Observe function of
// the service's payment client. With BILLING_PAYMENT_TOKEN_FILE the token is
// re-read from the file every secretReread, and at once after the provider
// answers 401 (the token may have been rotated under us); otherwise auth is
// nil and the client sends cfg.PaymentToken.
func paymentAuth(cfg config, logger *slog.Logger, observe func(string, time.Duration)) (auth func() []string, _ func(string, time.Duration), err error) {
	if cfg.PaymentTokenFile == "" {
		return nil, observe, nil
	}
	tok, err := payment.NewFileToken(cfg.PaymentTokenFile, secretReread, logger)
	if err != nil {
		return nil, nil, err
	}
	return tok.Header, func(code string, d time.Duration) {
		if code == "401" {
			tok.Refresh()
		}
		observe(code, d)
	}, nil
}
