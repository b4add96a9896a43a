package messages

// The decoders with the fast path on or off, for the tests that hold the
// two to the same result.

func DecodeSubmitOrderWith(body []byte, fast bool) (SubmitOrder, error) {
	return decodeSubmitOrder(body, fast)
}

func DecodeStepRequestWith(body []byte, fast bool) (StepRequest, error) {
	return decodeStepRequest(body, fast)
}

func DecodeStepReplyWith(body []byte, fast bool) (StepReply, error) {
	return decodeStepReply(body, fast)
}

func DecodeStatusEventWith(body []byte, fast bool) (StatusEvent, error) {
	return decodeStatusEvent(body, fast)
}

func NumberWritten(lit []byte) (int, error) { return numberWritten(lit) }
