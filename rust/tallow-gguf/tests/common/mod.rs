//! Writing GGUF images byte by byte, shared by the tests (each test file uses a part of it).

#![allow(dead_code)]

/// Writes GGUF images byte by byte, so tests can build exactly the file they need.
pub struct Builder {
    pub version: u32,
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

impl Builder {
    pub fn new() -> Self {
        Builder {
            version: 3,
            kv: Vec::new(),
            n_kv: 0,
            tensors: Vec::new(),
            n_tensors: 0,
            data: Vec::new(),
        }
    }

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    pub fn kv_raw(mut self, key: &str, type_id: u32, payload: &[u8]) -> Self {
        Self::string(&mut self.kv, key);
        self.kv.extend(type_id.to_le_bytes());
        self.kv.extend(payload);
        self.n_kv += 1;
        self
    }

    pub fn kv_u16(self, key: &str, v: u16) -> Self {
        self.kv_raw(key, 2, &v.to_le_bytes())
    }

    pub fn kv_u32(self, key: &str, v: u32) -> Self {
        self.kv_raw(key, 4, &v.to_le_bytes())
    }

    pub fn kv_i32(self, key: &str, v: i32) -> Self {
        self.kv_raw(key, 5, &v.to_le_bytes())
    }

    pub fn kv_str(self, key: &str, v: &str) -> Self {
        let mut payload = Vec::new();
        Self::string(&mut payload, v);
        self.kv_raw(key, 8, &payload)
    }

    pub fn kv_str_array(self, key: &str, items: &[&str]) -> Self {
        let mut payload = 8u32.to_le_bytes().to_vec();
        payload.extend((items.len() as u64).to_le_bytes());
        for s in items {
            Self::string(&mut payload, s);
        }
        self.kv_raw(key, 9, &payload)
    }

    /// Adds an F32 tensor with the given values, placed after the previous one.
    pub fn tensor_f32(mut self, name: &str, values: &[f32]) -> Self {
        let offset = self.data.len() as u64;
        self = self.tensor_raw(name, &[values.len() as u64], 0, offset);
        self.data
            .extend(values.iter().flat_map(|v| v.to_le_bytes()));
        while !self.data.len().is_multiple_of(32) {
            self.data.push(0);
        }
        self
    }

    pub fn tensor_raw(mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> Self {
        Self::string(&mut self.tensors, name);
        self.tensors.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.tensors.extend(d.to_le_bytes());
        }
        self.tensors.extend(type_id.to_le_bytes());
        self.tensors.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    pub fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        out.extend(&self.tensors);
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        out.extend(&self.data);
        out
    }
}
