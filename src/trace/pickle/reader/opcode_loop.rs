//! The opcode loop: what each opcode does to the stack, the marks and the memo.

use super::{Batch, Reader, Sink, R};
use crate::trace::pickle::error::PickleErrorKind as K;
use crate::trace::pickle::opcodes as op;
use crate::trace::pickle::text;
use crate::trace::pickle::value::{Document, Value};

impl<S: Sink> Reader<'_, '_, S> {
    pub(super) fn run(&mut self) -> R<Value> {
        loop {
            self.at = self.pos;
            let Some(&code) = self.input.get(self.pos) else {
                return Err(self.err(K::MissingStop));
            };
            self.op = code;
            self.pos += 1;
            match code {
                op::PROTO => {
                    let p = self.u8_arg()?;
                    if p > 5 {
                        return Err(self.err(K::Protocol(p)));
                    }
                }
                op::FRAME => {
                    // Frames only help streaming readers; the whole input is
                    // here, so check the length and read straight through.
                    let len = u64::from_le_bytes(self.array::<8>("frame length")?);
                    if len > self.left() as u64 {
                        return Err(self.err(K::LengthTooLarge {
                            op: "FRAME",
                            len,
                            left: self.left(),
                        }));
                    }
                    if S::ACTIVE {
                        self.sink.progress(self.at);
                    }
                }
                op::STOP => return self.pop(),
                op::MARK => {
                    self.marks.push(self.stack.len());
                    if S::ACTIVE && self.batch.is_none() {
                        if let Some(id) = self.stack.last().and_then(|&v| Document::list_id(v)) {
                            if self.claimed.contains(&id.0) {
                                self.batch = Some(Batch {
                                    depth: self.marks.len(),
                                    doc: self.doc.checkpoint(),
                                    memo_len: self.memo.dense.len(),
                                });
                                self.memo.floor = Some(self.memo.dense.len() as u64);
                                self.memo.dirty = false;
                            }
                        }
                    }
                }
                op::POP => {
                    if self.stack.len() > self.floor() {
                        self.stack.pop();
                    } else if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                        if S::ACTIVE {
                            self.closing = None;
                            self.mark_popped();
                        }
                    } else {
                        return Err(self.underflow(1));
                    }
                }
                op::POP_MARK => {
                    let m = self.pop_mark()?;
                    self.stack.truncate(m);
                }
                op::DUP => {
                    let v = self.top()?;
                    self.stack.push(v);
                }
                op::NONE => self.stack.push(Value::NONE),
                op::NEWTRUE => self.stack.push(Value::TRUE),
                op::NEWFALSE => self.stack.push(Value::FALSE),

                // Integers.
                op::BININT1 => {
                    let v = self.u8_arg()?;
                    let v = self.doc.int(v as i64);
                    self.push(v)?;
                }
                op::BININT2 => {
                    let v = u16::from_le_bytes(self.array::<2>("argument")?);
                    let v = self.doc.int(v as i64);
                    self.push(v)?;
                }
                op::BININT => {
                    let v = i32::from_le_bytes(self.array::<4>("argument")?);
                    let v = self.doc.int(v as i64);
                    self.push(v)?;
                }
                op::LONG1 => {
                    let b = self.payload::<1>()?;
                    self.long_bytes(b)?;
                }
                op::LONG4 => {
                    let b = self.payload_i32()?;
                    self.long_bytes(b)?;
                }
                op::INT => {
                    // Protocol 0 spells booleans as INT 00 / 01.
                    let line = self.line()?;
                    let v = match line {
                        b"00" => Ok(Value::FALSE),
                        b"01" => Ok(Value::TRUE),
                        _ => match text::parse_int(line) {
                            Some(i) => self.doc.int(i),
                            None => return Err(self.bad_text(line)),
                        },
                    };
                    self.push(v)?;
                }
                op::LONG => {
                    let i = self.text_int()?;
                    let v = self.doc.int(i);
                    self.push(v)?;
                }
                op::BINFLOAT => {
                    let f = f64::from_be_bytes(self.array::<8>("argument")?);
                    let v = self.doc.float(f);
                    self.push(v)?;
                }
                op::FLOAT => {
                    let line = self.line()?;
                    let f = text::parse_float(line).ok_or_else(|| self.bad_text(line))?;
                    let v = self.doc.float(f);
                    self.push(v)?;
                }

                // Strings and bytes.
                op::SHORT_BINUNICODE => {
                    let b = self.payload::<1>()?;
                    self.push_str_bytes(b)?;
                }
                op::BINUNICODE => {
                    let b = self.payload::<4>()?;
                    self.push_str_bytes(b)?;
                }
                op::BINUNICODE8 => {
                    let b = self.payload::<8>()?;
                    self.push_str_bytes(b)?;
                }
                op::SHORT_BINSTRING => {
                    let b = self.payload::<1>()?;
                    self.push_str_bytes(b)?;
                }
                op::BINSTRING => {
                    let b = self.payload_i32()?;
                    self.push_str_bytes(b)?;
                }
                op::STRING => {
                    let line = self.line()?;
                    let s = text::unquote_string(line).ok_or_else(|| self.bad_text(line))?;
                    self.push_str_bytes(&s)?;
                }
                op::UNICODE => {
                    let line = self.line()?;
                    let s = text::raw_unicode_escape(line);
                    let v = self.doc.string(&s);
                    self.push(v)?;
                }
                op::SHORT_BINBYTES => {
                    let b = self.payload::<1>()?;
                    let v = self.doc.bytes(b);
                    self.push(v)?;
                }
                op::BINBYTES => {
                    let b = self.payload::<4>()?;
                    let v = self.doc.bytes(b);
                    self.push(v)?;
                }
                op::BINBYTES8 => {
                    let b = self.payload::<8>()?;
                    let v = self.doc.bytes(b);
                    self.push(v)?;
                }

                // Containers.
                op::EMPTY_LIST => {
                    let v = self.doc.new_list();
                    self.push(v)?;
                    if S::ACTIVE
                        && self.batch.is_none()
                        && self.sink.claim(&self.doc, &self.stack, &self.marks)
                    {
                        if let Some(id) = self.stack.last().and_then(|&v| Document::list_id(v)) {
                            self.claimed.insert(id.0);
                        }
                    }
                }
                op::EMPTY_DICT => {
                    let v = self.doc.new_dict();
                    self.push(v)?;
                }
                op::EMPTY_SET => {
                    let v = self.doc.new_set(false);
                    self.push(v)?;
                }
                op::EMPTY_TUPLE => {
                    let v = self.doc.new_tuple(&[]);
                    self.push(v)?;
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = (code - op::TUPLE1 + 1) as usize;
                    if self.stack.len() < self.floor() + n {
                        return Err(self.underflow(n));
                    }
                    let from = self.stack.len() - n;
                    let v = self.doc.new_tuple(self.stack.get(from..).unwrap_or(&[]));
                    self.stack.truncate(from);
                    self.push(v)?;
                }
                op::TUPLE => {
                    let m = self.pop_mark()?;
                    let v = self.doc.new_tuple(self.stack.get(m..).unwrap_or(&[]));
                    self.stack.truncate(m);
                    self.push(v)?;
                }
                op::LIST => {
                    let m = self.pop_mark()?;
                    let v = self.doc.new_list().map_err(|e| self.limit(e))?;
                    self.fill_new(v, m)?;
                }
                op::DICT => {
                    let m = self.pop_mark()?;
                    let count = self.stack.len().saturating_sub(m);
                    if count % 2 != 0 {
                        return Err(self.err(K::OddItems { op: "DICT", count }));
                    }
                    let v = self.doc.new_dict().map_err(|e| self.limit(e))?;
                    self.fill_new(v, m)?;
                }
                op::FROZENSET => {
                    let m = self.pop_mark()?;
                    let v = self.doc.new_set(true).map_err(|e| self.limit(e))?;
                    self.fill_new(v, m)?;
                }
                op::APPEND => {
                    let item = self.pop()?;
                    let target = self.top()?;
                    let id =
                        Document::list_id(target).ok_or_else(|| self.wrong_type("list", target))?;
                    if self.is_claimed(id) {
                        self.stack.push(item);
                        self.send_to_sink(id, self.stack.len() - 1)?;
                    } else {
                        self.doc.extend(id, &[item]).map_err(|e| self.limit(e))?;
                    }
                }
                op::APPENDS => {
                    let m = self.pop_mark()?;
                    let closing = self.closing.take();
                    let id = self.batch_target(m, Document::list_id, "list")?;
                    if self.is_claimed(id) {
                        self.send_to_sink(id, m)?;
                        if let Some(batch) = closing {
                            self.close_batch(batch);
                        }
                    } else {
                        if closing.is_some() {
                            // Not the claimed list after all: keep everything.
                            self.doc.end_batch();
                        }
                        self.extend(id, m)?;
                    }
                }
                op::SETITEM => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let target = self.top()?;
                    let id =
                        Document::dict_id(target).ok_or_else(|| self.wrong_type("dict", target))?;
                    self.doc.extend(id, &[k, v]).map_err(|e| self.limit(e))?;
                }
                op::SETITEMS => {
                    let m = self.pop_mark()?;
                    let count = self.stack.len().saturating_sub(m);
                    if count % 2 != 0 {
                        return Err(self.err(K::OddItems {
                            op: "SETITEMS",
                            count,
                        }));
                    }
                    let id = self.batch_target(m, Document::dict_id, "dict")?;
                    self.extend(id, m)?;
                }
                op::ADDITEMS => {
                    let m = self.pop_mark()?;
                    let id = self.batch_target(m, Document::set_id, "set")?;
                    self.extend(id, m)?;
                }

                // Memo.
                op::MEMOIZE => {
                    let idx = self.memo.count;
                    self.memo_put(idx)?;
                }
                op::BINPUT => {
                    let idx = self.u8_arg()? as u64;
                    self.memo_put(idx)?;
                }
                op::LONG_BINPUT => {
                    let idx = u32::from_le_bytes(self.array::<4>("memo index")?) as u64;
                    self.memo_put(idx)?;
                }
                op::PUT => {
                    let idx = self.text_int()?;
                    let idx = u64::try_from(idx).map_err(|_| self.bad_text(b"negative index"))?;
                    self.memo_put(idx)?;
                }
                op::BINGET | op::LONG_BINGET => {
                    // Gets come in runs (a trace entry's keys and the
                    // strings they share): taken here one after another,
                    // without a trip through the dispatch for each.
                    let mut get = code;
                    loop {
                        let idx = if get == op::BINGET {
                            self.u8_arg()? as u64
                        } else {
                            u32::from_le_bytes(self.array::<4>("memo index")?) as u64
                        };
                        self.memo_get(idx)?;
                        match self.input.get(self.pos) {
                            Some(&next @ (op::BINGET | op::LONG_BINGET)) => {
                                self.at = self.pos;
                                self.op = next;
                                self.pos += 1;
                                get = next;
                            }
                            _ => break,
                        }
                    }
                }
                op::GET => {
                    let idx = self.text_int()?;
                    self.memo_get(idx as u64)?;
                }
                other => {
                    return Err(self.err(match op::unsupported_name(other) {
                        Some(n) => K::Unsupported(n),
                        None => K::UnknownOpcode(other),
                    }))
                }
            }
        }
    }
}
