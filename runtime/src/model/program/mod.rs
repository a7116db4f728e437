//! A model program on the engine: its values as row-major tensors ([`tensor`]), the math of its operations
//! forward and backward ([`ops`]) and the interpreter that runs it stage by stage over the units streamed to
//! it ([`exec`]).

pub mod exec;
pub mod ops;
pub mod tensor;

#[cfg(test)]
mod tests;
