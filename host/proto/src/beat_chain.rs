//! Heartbeats proven by a hash chain instead of a signature each.
//!
//! A node signs its membership entry once per change of what the entry says (address,
//! status, location, configuration, incarnation), together with the anchor of a fresh hash
//! chain: `anchor = H^LEN(seed)` for a secret random `seed`. The heartbeat `first + k` is then
//! proven by revealing `H^(LEN - k)(seed)`, which hashes to the anchor in `k` steps. Revealing
//! the token of one beat gives away the tokens of the beats before it, never of a later one,
//! so nobody but the node can advance its heartbeat, and a checker that verified beat `a`
//! checks beat `b > a` with `b - a` hashes of 32 bytes rather than an Ed25519 verification:
//! a view of N members costs each node N hashes per gossip interval instead of N signature
//! checks. After `LEN` beats, or when the entry changes, the node signs a new chain.
//!
//! This is the TESLA / S/KEY construction (Lamport's one-time password chain), used here only
//! to order versions of an entry whose body is signed.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Beats one chain proves (a new signature after this many heartbeats).
pub const LEN: u64 = 256;

/// One link of a chain.
pub type Token = [u8; 32];

/// The heartbeat part of an entry's proof: the chain the signature covers (`first`, `anchor`)
/// and the token of the entry's heartbeat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BeatProof {
    /// The heartbeat the chain starts at (its token is the anchor).
    pub first: u64,
    pub anchor: Token,
    /// The token of the entry's heartbeat.
    pub token: Token,
}

/// One step down the chain: SHA-256 under a domain tag.
pub fn step(token: &Token) -> Token {
    let mut h = Sha256::new();
    h.update(b"timeshard beat chain v1\0");
    h.update(token);
    h.finalize().into()
}

/// Whether `token` reaches `target` in exactly `steps` steps. `steps` is bounded by [`LEN`]
/// (a larger count is refused before any hashing).
pub fn reaches(token: &Token, steps: u64, target: &Token) -> bool {
    if steps > LEN {
        return false;
    }
    let mut t = *token;
    for _ in 0..steps {
        t = step(&t);
    }
    t == *target
}

/// Whether `proof` proves `heartbeat`: within its chain's beats, and its token hashes to the
/// anchor.
pub fn proves(proof: &BeatProof, heartbeat: u64) -> bool {
    heartbeat.checked_sub(proof.first).is_some_and(|k| reaches(&proof.token, k, &proof.anchor))
}

/// A chain as its node holds it: every token, from the anchor (beat `first`) to the seed
/// (beat `first + LEN`).
#[derive(Clone, Debug)]
pub struct BeatChain {
    first: u64,
    tokens: Vec<Token>,
}

impl BeatChain {
    /// A chain from secret `seed` whose anchor proves heartbeat `first`.
    pub fn new(first: u64, seed: Token) -> BeatChain {
        let mut tokens = vec![seed; usize::try_from(LEN).expect("LEN fits") + 1];
        for k in (0..tokens.len() - 1).rev() {
            tokens[k] = step(&tokens[k + 1]);
        }
        BeatChain { first, tokens }
    }

    /// The heartbeat its anchor proves.
    pub fn first(&self) -> u64 {
        self.first
    }

    pub fn anchor(&self) -> Token {
        self.tokens[0]
    }

    /// The proof of `heartbeat`, if this chain covers it.
    pub fn prove(&self, heartbeat: u64) -> Option<BeatProof> {
        let k = usize::try_from(heartbeat.checked_sub(self.first)?).ok()?;
        let token = *self.tokens.get(k)?;
        Some(BeatProof { first: self.first, anchor: self.anchor(), token })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_beat_of_the_chain_is_proven_and_no_later_one_can_be_made_from_it() {
        let chain = BeatChain::new(40, [7; 32]);
        for beat in [40, 41, 100, 40 + LEN] {
            let proof = chain.prove(beat).unwrap();
            assert!(proves(&proof, beat), "beat {beat}");
            // The token does not prove the next beat, nor the one before.
            assert!(!proves(&proof, beat + 1));
            assert!(beat == 40 || !proves(&proof, beat - 1));
        }
        assert_eq!(chain.prove(39), None, "before the chain");
        assert_eq!(chain.prove(41 + LEN), None, "past its end");
        // A later beat's token hashes to an earlier one's: what a checker that verified the
        // earlier beat relies on.
        let (a, b) = (chain.prove(60).unwrap(), chain.prove(63).unwrap());
        assert!(reaches(&b.token, 3, &a.token));
        assert!(!reaches(&a.token, 3, &b.token));
    }

    #[test]
    fn a_step_count_past_the_chain_is_refused_without_hashing() {
        let chain = BeatChain::new(0, [1; 32]);
        let mut proof = chain.prove(0).unwrap();
        assert!(proves(&proof, 0));
        proof.first = 0;
        assert!(!proves(&proof, u64::MAX), "a heartbeat far past the chain");
        assert!(!proves(&proof, LEN + 1));
        let mut before = chain.prove(5).unwrap();
        before.first = 10;
        assert!(!proves(&before, 5), "a heartbeat before the chain's first beat");
    }
}
