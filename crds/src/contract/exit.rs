//! The exit statuses a role program ends with besides success and failure, which its supervisor (the
//! operator, `wsctl run`) reads: spelled once, for the program that exits and the one that watches.

/// A program stopped by a termination signal (SIGTERM, Ctrl-C) at a step boundary, its state checkpointed:
/// not a failure of the job. 143, as a shell reports a process killed by SIGTERM.
pub const STOPPED_STATUS: i32 = 143;

/// A program that refused the job's input: its data, its model or its plan is wrong (a corrupt tokenizer, a
/// model it cannot run, more SRAM than the engine has). Running it again meets the same input and fails the same
/// way, so its supervisor fails the job at once, with the program's words, instead of replacing it until the
/// restart limit runs out. 65, `EX_DATAERR` in `sysexits.h`.
pub const REFUSED_STATUS: i32 = 65;

/// What an exit status says about the program that ended with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Status 0: it did its work.
    Success,
    /// [`STOPPED_STATUS`]: asked to stop, its state saved.
    Stopped,
    /// [`REFUSED_STATUS`]: the job's input is wrong; another run fails the same way.
    Refused,
    /// Any other status: a fault another run may not meet (a crash, a lost peer), so it is replaced.
    Failed,
}

impl Exit {
    /// The meaning of exit status `code`.
    pub fn of(code: i32) -> Exit {
        match code {
            0 => Exit::Success,
            STOPPED_STATUS => Exit::Stopped,
            REFUSED_STATUS => Exit::Refused,
            _ => Exit::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_status_reads_as_what_it_says() {
        assert_eq!(Exit::of(0), Exit::Success);
        assert_eq!(Exit::of(STOPPED_STATUS), Exit::Stopped);
        assert_eq!(Exit::of(REFUSED_STATUS), Exit::Refused);
        assert_eq!(Exit::of(1), Exit::Failed);
        assert_eq!(Exit::of(137), Exit::Failed, "killed (OOM, SIGKILL): another run may not meet it");
        assert_ne!(STOPPED_STATUS, REFUSED_STATUS);
    }
}
