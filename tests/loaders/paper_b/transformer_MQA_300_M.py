"""The model classes of Brainchip-Inc/Do-Transformers-Need-3-Projections
``transformer_MQA_300_M.py`` (commit ffedd92e, MIT licence, see LICENSE and SOURCES.md here).

Vendored verbatim from ``class ModelConfig`` to the end of the GPT class; cut
out: the imports of the training stack, ``TrainingConfig`` and everything after
the model (data loading, training loop). ``flash_attn`` is absent, so the
standard attention path runs (``FLASH_AVAILABLE = False``).
"""
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

FLASH_AVAILABLE = False
flash_attn_func = None


@dataclass
class ModelConfig:
    """Model architecture configuration"""
    vocab_size: int = 50304
    n_positions: int = 2048
    n_layer: int = 20
    n_embd: int = 1024
    n_head: int = 16
    n_kv_groups: int = 1  # MQA: Single KV head shared by ALL query heads
    n_inner: int = 4096
    
    embd_pdrop: float = 0.0
    resid_pdrop: float = 0.1
    attn_pdrop: float = 0.0
    
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    use_bias: bool = True
    tie_word_embeddings: bool = True
    
    use_flash_attention: bool = True


# ============================================================================
# MODEL: MULTI-QUERY ATTENTION (MQA)
# ============================================================================

class MQAttention(nn.Module):
    """
    Multi-Query Attention (MQA) - Used in PaLM, Falcon
    
    Key characteristics:
    - Full Q projection with n_head heads (e.g., 16 heads)
    - SINGLE shared K head (used by all query heads)
    - SINGLE shared V head (used by all query heads)
    
    Benefits:
    - Extreme KV cache reduction: 94% smaller than standard QKV!
    - Fastest decoding speed among all variants
    - Minimal additional parameters during inference
    
    Trade-off:
    - Less expressive than GQA/QKV (single KV for all queries)
    - Typically 1-3% quality degradation vs GQA
    
    Example with n_head=16:
    - 16 separate query heads
    - 1 key head (shared by ALL 16 query heads)
    - 1 value head (shared by ALL 16 query heads)
    - Cache stores 1 KV head instead of 16 (94% reduction!)
    """
    
    def __init__(self, config: ModelConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        assert config.n_kv_groups == 1, \
            f"MQA requires n_kv_groups=1, got {config.n_kv_groups}"
        
        self.n_embd = config.n_embd
        self.n_head = config.n_head
        self.n_kv_groups = 1  # MQA: Always 1
        self.n_head_per_group = config.n_head  # All heads share single KV
        self.head_dim = config.n_embd // config.n_head
        self.dropout = config.attn_pdrop
        self.use_flash = config.use_flash_attention and FLASH_AVAILABLE
        
        # Full query projection (all n_head heads)
        self.c_q = nn.Linear(config.n_embd, config.n_embd, bias=config.use_bias)
        
        # SINGLE KV head (shared by all queries)
        # This is the KEY difference from GQA and standard QKV!
        kv_dim = 1 * self.head_dim  # Just one head!
        self.c_kv = nn.Linear(config.n_embd, 2 * kv_dim, bias=config.use_bias)
        
        # Output projection (same as all variants)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.use_bias)
        
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        
        # Causal mask
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(config.n_positions, config.n_positions))
            .view(1, 1, config.n_positions, config.n_positions)
        )
        
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x: [batch, seq_len, n_embd]
            
        Returns:
            out: [batch, seq_len, n_embd]
        """
        B, T, C = x.size()
        
        # Query projection: Full n_head heads
        q = self.c_q(x)  # [B, T, n_embd]
        q = q.view(B, T, self.n_head, self.head_dim)  # [B, T, n_head, head_dim]
        
        # Key, Value projections: Only 1 head (SINGLE shared head!)
        kv = self.c_kv(x)  # [B, T, 2 * head_dim]
        k, v = kv.split(self.head_dim, dim=2)
        k = k.view(B, T, 1, self.head_dim)  # [B, T, 1, head_dim]
        v = v.view(B, T, 1, self.head_dim)
        
        # Repeat single KV head to match all query heads
        # The SAME K and V are used by ALL 16 query heads!
        # Example: [B, T, 1, head_dim] -> [B, T, 16, head_dim]
        k = k.repeat_interleave(self.n_head_per_group, dim=2)  # [B, T, n_head, head_dim]
        v = v.repeat_interleave(self.n_head_per_group, dim=2)
        
        # Now q, k, v all have shape [B, T, n_head, head_dim]
        # But k and v came from SINGLE head with minimal parameters!
        
        # Choose attention implementation
        if self.use_flash:
            # Flash Attention: [B, T, n_head, head_dim]
            out = flash_attn_func(
                q, k, v,
                dropout_p=self.dropout if self.training else 0.0,
                causal=True
            )
        else:
            # Standard attention
            # Transpose to [B, n_head, T, head_dim]
            q = q.transpose(1, 2)
            k = k.transpose(1, 2)
            v = v.transpose(1, 2)
            
            # Attention scores: [B, n_head, T, T]
            scale = 1.0 / math.sqrt(self.head_dim)
            attn = torch.matmul(q, k.transpose(-2, -1)) * scale
            
            # Apply causal mask
            attn = attn.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
            
            # Softmax
            attn = F.softmax(attn, dim=-1)
            attn = self.attn_dropout(attn)
            
            # Apply attention to values
            out = torch.matmul(attn, v)  # [B, n_head, T, head_dim]
            out = out.transpose(1, 2)    # [B, T, n_head, head_dim]
        
        # Merge heads
        out = out.contiguous().view(B, T, C)
        
        # Output projection
        out = self.c_proj(out)
        out = self.resid_dropout(out)
        
        return out


class MLP(nn.Module):
    """Feed-forward network (identical across all variants)"""
    
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.n_inner, bias=config.use_bias)
        self.c_proj = nn.Linear(config.n_inner, config.n_embd, bias=config.use_bias)
        self.act = nn.GELU()
        self.dropout = nn.Dropout(config.resid_pdrop)
        
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.c_fc(x)
        x = self.act(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x


class TransformerBlock(nn.Module):
    """Single transformer block with MQA"""
    
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = MQAttention(config)  # MQA instead of standard QKV!
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)
        
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT_MQA(nn.Module):
    """GPT Language Model with Multi-Query Attention (MQA)"""
    
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        
        # Token and position embeddings (identical to all variants)
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        
        # Transformer blocks with MQA
        self.h = nn.ModuleList([TransformerBlock(config) for _ in range(config.n_layer)])
        
        # Final layer norm
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        
        # LM head (tied with token embeddings if specified)
        if config.tie_word_embeddings:
            self.lm_head = lambda x: F.linear(x, self.wte.weight)
        else:
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        
        # Initialize weights
        self.apply(self._init_weights)
        
    def _init_weights(self, module):
        """Initialize weights (GPT-2 style)"""
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, nn.LayerNorm):
            torch.nn.init.zeros_(module.bias)
            torch.nn.init.ones_(module.weight)
    
    def forward(
        self,
        input_ids: torch.Tensor,
        labels: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """
        Args:
            input_ids: [batch, seq_len] token indices
            labels: [batch, seq_len] target token indices (for training)
            
        Returns:
            logits: [batch, seq_len, vocab_size]
            loss: scalar (if labels provided)
        """
        device = input_ids.device
        b, t = input_ids.size()
        assert t <= self.config.n_positions, f"Sequence length {t} exceeds maximum {self.config.n_positions}"
        
        # Token embeddings
        tok_emb = self.wte(input_ids)  # [b, t, n_embd]
        
        # Position embeddings
        pos = torch.arange(0, t, dtype=torch.long, device=device).unsqueeze(0)  # [1, t]
        pos_emb = self.wpe(pos)  # [1, t, n_embd]
        
        # Combined embeddings
        x = self.drop(tok_emb + pos_emb)
        
        # Transformer blocks
        for block in self.h:
            x = block(x)
        
        # Final layer norm
        x = self.ln_f(x)
        
        # LM head
        logits = self.lm_head(x)  # [b, t, vocab_size]
        
        # Calculate loss if labels provided
        loss = None
        if labels is not None:
            # Shift logits and labels for next-token prediction
            shift_logits = logits[..., :-1, :].contiguous()
            shift_labels = labels[..., 1:].contiguous()
            
            # Cross entropy loss
            loss = F.cross_entropy(
                shift_logits.view(-1, shift_logits.size(-1)),
                shift_labels.view(-1),
                ignore_index=-100
            )
        
        return logits, loss
    
    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None
    ) -> torch.Tensor:
        """
        Generate tokens autoregressively
        
        Args:
            idx: [batch, seq_len] conditioning sequence
            max_new_tokens: number of tokens to generate
            temperature: sampling temperature (higher = more random)
            top_k: if set, only sample from top k tokens
            
        Returns:
            idx: [batch, seq_len + max_new_tokens]
        """
        for _ in range(max_new_tokens):
            # Crop context if needed
            idx_cond = idx if idx.size(1) <= self.config.n_positions else idx[:, -self.config.n_positions:]
            
            # Forward pass
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature  # [batch, vocab_size]
            
            # Optional top-k sampling
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float('Inf')
            
            # Sample
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            
            # Append to sequence
            idx = torch.cat((idx, idx_next), dim=1)
        
        return idx
