//! Which request asked each id of a lookup trace, and when each request finished: what a serving
//! engine's scheduler knows of every lookup it makes, rebuilt from the trace's steps and its
//! documents' prompt and output lengths. The scheduler is continuous batching with chunked
//! prefill, first come first served: a step's ids are its decode tokens' (one for each request
//! whose prompt is prefilled and whose output is not complete, in arrival order), then its
//! prefill tokens' (taken from the requests in arrival order); a request finishes with its last
//! output token (or its last prompt token, when it has no output).
use std::ops::Range;
use std::path::Path;

use super::trace::Step;
use crate::{Error, Result};

/// A request's lengths, as the documents file gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub prompt_tokens: u64,
    pub output_tokens: u64,
}

/// The ids of a step (positions in the step's batch) that one request asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSpan {
    /// The request's place in arrival order.
    pub request: u32,
    pub ids: Range<usize>,
}

/// A step's ids by request, and the requests that finished with the step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepRequests {
    pub spans: Vec<RequestSpan>,
    pub finished: Vec<u32>,
}

/// The requests of a documents file (a JSON array of objects with `prompt_tokens` and
/// `output_tokens`, in arrival order, as `give.docs.json`).
pub fn read_requests(path: &Path) -> Result<Vec<Request>> {
    Ok(
        super::trace::read_doc_fields(path, ["prompt_tokens", "output_tokens"])?
            .into_iter()
            .map(|[prompt_tokens, output_tokens]| Request {
                prompt_tokens,
                output_tokens,
            })
            .collect(),
    )
}

/// Each step's ids by request and the requests finishing with it. Fails where the steps and
/// the requests disagree: a step decoding more tokens than requests are decoding, or
/// prefilling past the last prompt.
pub fn step_requests(
    steps: &[Step],
    requests: &[Request],
    ids_per_token: usize,
) -> Result<Vec<StepRequests>> {
    let mismatch = |t: usize, why: String| {
        Error::invalid(
            "documents file",
            format!("step {t} does not follow from its requests: {why}"),
        )
    };
    let too_many = u32::try_from(requests.len()).is_err();
    if too_many {
        return Err(Error::invalid(
            "documents file",
            format!("{} requests; want below 2^32", requests.len()),
        ));
    }
    let mut prompt_left: Vec<u64> = requests.iter().map(|r| r.prompt_tokens).collect();
    let mut output_left: Vec<u64> = requests.iter().map(|r| r.output_tokens).collect();
    // Requests prefilled with output to come, in arrival order (prefill completes in that order).
    let mut decoding: Vec<u32> = Vec::new();
    // The first request whose prompt is not all prefilled.
    let mut next = 0usize;
    let mut out = Vec::with_capacity(steps.len());
    for (t, s) in steps.iter().enumerate() {
        let mut step = StepRequests::default();
        // A request with no prompt (one a trace cut mid-decode) decodes once every request
        // before it is prefilled.
        while next < requests.len() && prompt_left[next] == 0 {
            if requests[next].prompt_tokens == 0 && output_left[next] > 0 {
                decoding.push(next as u32);
            }
            next += 1;
        }
        let mut at = 0;
        let d = s.decode as usize;
        if decoding.len() < d {
            return Err(mismatch(
                t,
                format!("{d} decode tokens, {} requests decoding", decoding.len()),
            ));
        }
        for &r in &decoding[..d] {
            step.spans.push(RequestSpan {
                request: r,
                ids: at..at + ids_per_token,
            });
            at += ids_per_token;
            output_left[r as usize] -= 1;
            if output_left[r as usize] == 0 {
                step.finished.push(r);
            }
        }
        decoding.retain(|&r| output_left[r as usize] > 0);
        let mut prefill = u64::from(s.prefill);
        while prefill > 0 {
            while next < requests.len() && prompt_left[next] == 0 {
                next += 1;
            }
            if next == requests.len() {
                return Err(mismatch(
                    t,
                    format!("its prefill tokens run past the {} prompts", requests.len()),
                ));
            }
            let n = prefill.min(prompt_left[next]);
            let len = n as usize * ids_per_token;
            step.spans.push(RequestSpan {
                request: next as u32,
                ids: at..at + len,
            });
            at += len;
            prefill -= n;
            prompt_left[next] -= n;
            if prompt_left[next] == 0 {
                if output_left[next] == 0 {
                    step.finished.push(next as u32);
                } else {
                    decoding.push(next as u32);
                }
            }
        }
        out.push(step);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(decode: u32, prefill: u32) -> Step {
        Step { decode, prefill }
    }

    #[test]
    fn decode_and_prefill_tokens_go_to_their_requests_and_requests_finish_with_their_output() {
        // Request 0: 3 prompt tokens, 2 output; request 1: 2 prompt, 1 output; request 2: 1
        // prompt, none. Step 0 prefills 2 of request 0; step 1 prefills its last and request
        // 1's first; step 2 decodes request 0 and prefills request 1's last and request 2
        // (which finishes there); step 3 decodes requests 0 and 1, both finishing.
        let requests = [(3, 2), (2, 1), (1, 0)].map(|(p, o)| Request {
            prompt_tokens: p,
            output_tokens: o,
        });
        let steps = [step(0, 2), step(0, 2), step(1, 2), step(2, 0)];
        let r = step_requests(&steps, &requests, 2).unwrap();
        let span = |request, ids| RequestSpan { request, ids };
        assert_eq!(r[0].spans, [span(0, 0..4)]);
        assert_eq!(r[1].spans, [span(0, 0..2), span(1, 2..4)]);
        assert_eq!(r[2].spans, [span(0, 0..2), span(1, 2..4), span(2, 4..6)]);
        assert_eq!(r[2].finished, [2]);
        assert_eq!(r[3].spans, [span(0, 0..2), span(1, 2..4)]);
        assert_eq!(r[3].finished, [0, 1]);
        assert!(r[..2].iter().all(|s| s.finished.is_empty()));
        // A decode token no request can have made, or prefill past the prompts, is refused.
        assert!(step_requests(&[step(1, 2)], &requests, 2).is_err());
        assert!(step_requests(&[step(0, 7)], &requests, 2).is_err());
    }
}
