//go:build !linux

package service

import "os"

// applyTimerSlack checks SAS_TIMER_SLACK; only Linux has a timer slack.
func applyTimerSlack() (note string, err error) {
	_, err = timerSlack(os.Getenv)
	return "", err
}
